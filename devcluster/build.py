"""Finding (and if needed building) the control-plane binaries and helm.

The build itself lives in ``scripts/devcluster-prereqs.sh``: it installs the
Debian packages, compiles kube-apiserver, kube-controller-manager and
kube-scheduler from Debian's ``kubernetes`` source package and fetches helm.
Results are cached per machine under :func:`~devcluster.config.default_cache_dir`,
keyed by version, so only the first run on a machine takes minutes.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from devcluster.config import REPO_ROOT

logger = logging.getLogger(__name__)

KUBE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
#: Must match PATCH_LEVEL in scripts/devcluster-prereqs.sh (part of the cache key).
PATCH_LEVEL = 1
SUFFIX = f"-devcluster{PATCH_LEVEL}"
#: Must match NODE_PATCH_LEVEL in scripts/devcluster-prereqs.sh (kubelet, kube-proxy, pause).
NODE_PATCH_LEVEL = 1
NODE_SUFFIX = f"-nodes{NODE_PATCH_LEVEL}"
PREREQS_SCRIPT = REPO_ROOT / "scripts" / "devcluster-prereqs.sh"


class BuildError(RuntimeError):
    """The binaries are missing and could not be built."""


@dataclass(frozen=True)
class Binaries:
    """Paths of every executable a cluster runs."""

    version: str
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    etcd: Path
    kubectl: Path | None
    helm: Path | None


def kube_version(path: Path, suffix: str = SUFFIX) -> str:
    """``kubernetes-1.20.5+really1.20.2-devcluster1`` -> ``1.20.2``."""
    return path.name.removeprefix("kubernetes-").removesuffix(suffix).split("really")[-1]


def _version_key(path: Path, suffix: str = SUFFIX) -> tuple[int, ...]:
    name = kube_version(path, suffix)
    parts: list[int] = []
    for piece in name.replace("+", ".").replace("-", ".").split("."):
        if piece.isdigit():
            parts.append(int(piece))
    return tuple(parts)


def cached_kubernetes(cache_dir: Path, suffix: str = SUFFIX) -> Path | None:
    """The newest complete ``kubernetes-<version><suffix>`` cache entry, if any."""
    wanted = os.environ.get("DEVCLUSTER_KUBE_VERSION")
    candidates = [
        d
        for d in cache_dir.glob(f"kubernetes-*{suffix}")
        if (d / ".complete").exists() and (wanted is None or kube_version(d, suffix) == wanted)
    ]
    if not candidates:
        return None
    return max(candidates, key=lambda d: _version_key(d, suffix))


def cached_pause(cache_dir: Path) -> Path | None:
    """The static ``pause`` binary cached beside the node binaries, if built."""
    nodes = cached_kubernetes(cache_dir, NODE_SUFFIX)
    return nodes / "bin" / "pause" if nodes is not None else None


def cached_helm(cache_dir: Path) -> Path | None:
    """The cached helm binary, if any."""
    found = sorted(cache_dir.glob("helm-*/helm"))
    return found[-1] if found else None


def run_prereqs(cache_dir: Path) -> None:
    """Run the prerequisites script, streaming its progress to stderr."""
    logger.warning(
        "devcluster: Kubernetes binaries are not cached yet; building them now. "
        "The first build takes several minutes; later runs reuse %s",
        cache_dir,
    )
    env = dict(os.environ, DEVCLUSTER_CACHE=str(cache_dir))
    result = subprocess.run(
        ["bash", str(PREREQS_SCRIPT)], env=env, stdin=subprocess.DEVNULL, check=False
    )
    if result.returncode != 0:
        raise BuildError(f"{PREREQS_SCRIPT.name} failed with exit code {result.returncode}")


def find_binaries(cache_dir: Path, *, build: bool = True) -> Binaries:
    """Locate every binary; build or fetch what is missing when ``build`` is true."""
    kube = cached_kubernetes(cache_dir)
    helm = cached_helm(cache_dir)
    etcd = shutil.which("etcd")
    if (kube is None or helm is None or etcd is None) and build:
        run_prereqs(cache_dir)
        kube = cached_kubernetes(cache_dir)
        helm = cached_helm(cache_dir)
        etcd = shutil.which("etcd")
    if kube is None:
        raise BuildError(f"no Kubernetes binaries in {cache_dir}; run {PREREQS_SCRIPT}")
    if etcd is None:
        raise BuildError("etcd is not installed (Debian package etcd-server)")
    kubectl = shutil.which("kubectl")
    if kubectl is None and helm is not None and (helm.parent / "kubectl").exists():
        kubectl = str(helm.parent / "kubectl")
    bin_dir = kube / "bin"
    return Binaries(
        version=kube_version(kube),
        kube_apiserver=bin_dir / "kube-apiserver",
        kube_controller_manager=bin_dir / "kube-controller-manager",
        kube_scheduler=bin_dir / "kube-scheduler",
        etcd=Path(etcd),
        kubectl=Path(kubectl) if kubectl else None,
        helm=helm,
    )


@dataclass(frozen=True)
class NodeBinaries:
    """The node binaries of real nodes (containerd and runc come from Debian's packages)."""

    kubelet: Path
    kube_proxy: Path
    pause: Path


def find_node_binaries(cache_dir: Path, *, build: bool = True) -> NodeBinaries:
    """kubelet, kube-proxy and pause; built by the prerequisites script when missing."""
    nodes = cached_kubernetes(cache_dir, NODE_SUFFIX)
    if nodes is None and build:
        run_prereqs(cache_dir)
        nodes = cached_kubernetes(cache_dir, NODE_SUFFIX)
    if nodes is None:
        raise BuildError(f"no kubelet/kube-proxy in {cache_dir}; run {PREREQS_SCRIPT}")
    for tool in ("containerd", "ctr", "runc", "nsenter", "ip", "dnsmasq"):
        if shutil.which(tool) is None:
            raise BuildError(f"{tool} is not installed; run {PREREQS_SCRIPT}")
    bin_dir = nodes / "bin"
    return NodeBinaries(
        kubelet=bin_dir / "kubelet", kube_proxy=bin_dir / "kube-proxy", pause=bin_dir / "pause"
    )
