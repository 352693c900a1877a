"""Leaving nothing of real nodes behind: container processes, mounts, cgroups, files, sysctls.

``down`` (also after a crash half-way through ``up``) calls, after stopping the kubelets and
kube-proxies and before stopping containerd and its shims (:mod:`devcluster.procs`):

1. :func:`kill_containers`: container processes do not carry the cluster's marker variable,
   and containerd puts every node's containers in the same cgroup parent (``/k8s.io``), but
   each node's runc keeps its state under the node's containerd state directory: ``runc
   delete --force`` with that root kills each container's processes and removes its cgroups.

then, once no process of the cluster is left:

2. :func:`unmount_all`: every host mount under the run directory. The nodes mount in their
   own mount namespaces (:mod:`devcluster.nodes`), which vanish with their processes; this
   catches anything mounted from the host (a node's leftovers are unmounted by ``node_delete``
   the same way);
3. :func:`remove_node_files`: what CNI and the shims write outside the run directory, at fixed
   paths: libcni's cache files and the shims' sockets, named after this cluster's ids;
4. :func:`restore_kernel_tunables`: a kubelet sets machine-wide sysctls at start (its
   ``protect-kernel-defaults=false`` behaviour: ``vm.overcommit_memory=1``, ``kernel.panic=10``,
   ``kernel.panic_on_oops=1``...). The values from before the first kubelet are kept in a
   machine-wide file under /run with the run directories of the clusters using them; the last
   cluster to go down puts them back.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from devcluster import procs
from devcluster.config import ClusterConfig
from devcluster.nodes import RealNode, real_nodes

logger = logging.getLogger(__name__)

CNI_CACHE = Path("/var/lib/cni")
#: containerd 1.6 puts its shims' sockets here whatever its state directory.
SHIM_SOCKETS = Path("/run/containerd/s")
#: Machine-wide (not per cluster): the sysctls before any devcluster kubelet changed them.
TUNABLES_DIR = Path("/run/elasticjob-devcluster")
#: The sysctls kubelet 1.20 sets when it starts (pkg/kubelet/cm: setupKernelTunables).
KERNEL_TUNABLES = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)


def _runc_root(node: RealNode) -> Path:
    return node.containerd_dir / "state" / "runc" / "k8s.io"


def container_ids(node: RealNode) -> set[str]:
    """Ids of the node's containers and sandboxes that containerd or runc still have state of."""
    ids: set[str] = set()
    for d in (node.containerd_dir / "state" / "io.containerd.runtime.v2.task" / "k8s.io",
              _runc_root(node)):  # fmt: skip
        if d.is_dir():
            ids.update(p.name for p in d.iterdir())
    return ids


def kill_containers(
    cfg: ClusterConfig, nodes: list[RealNode] | None = None, timeout: float = 30.0
) -> None:
    """``runc delete --force`` every container of the nodes (default: all): kills its
    processes (frozen ones too) and removes its cgroups and runc state."""
    deadline = time.monotonic() + timeout
    for node in real_nodes(cfg) if nodes is None else nodes:
        root = _runc_root(node)
        while root.is_dir() and (ids := [p.name for p in root.iterdir()]):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{node.name}: runc could not delete containers {ids}")
            logger.info("%s: deleting %d container(s) with runc", node.name, len(ids))
            for cid in ids:
                subprocess.run(
                    ["runc", "--root", str(root), "delete", "--force", cid],
                    capture_output=True,
                    timeout=max(1.0, deadline - time.monotonic()),
                    check=False,
                )


def mounts_under(root: Path) -> list[str]:
    """Mount points below ``root``."""
    prefix = str(root.resolve()).rstrip("/") + "/"
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")
            if point.startswith(prefix):
                found.append(point)
    return found


def unmount_all(root: Path, timeout: float = 10.0) -> None:
    """Unmount everything mounted under ``root`` (stacked mounts too), deepest first."""
    deadline = time.monotonic() + timeout
    while mounts := mounts_under(root):
        if time.monotonic() > deadline:
            raise RuntimeError(f"could not unmount: {mounts[:5]}")
        for point in sorted(set(mounts), key=lambda p: p.count("/"), reverse=True):
            result = subprocess.run(["umount", point], capture_output=True, check=False)
            if result.returncode != 0:
                subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def remove_node_files(cfg: ClusterConfig) -> None:
    """libcni's cache files and the shims' sockets of this cluster, outside the run directory."""
    for node in real_nodes(cfg):
        ids = container_ids(node)
        # libcni caches each sandbox's result as <network>-<id>-<interface>; the network is
        # named after the node (unique to this cluster) and the loopback one "cni-loopback".
        for cached in CNI_CACHE.glob(f"results/{node.netns}-*"):
            ids.add(cached.name.removeprefix(f"{node.netns}-").rsplit("-", 1)[0])
            cached.unlink()
        for cid in ids:
            (CNI_CACHE / "results" / f"cni-loopback-{cid}-lo").unlink(missing_ok=True)
            # The shim's socket: containerd names it after its own address and the sandbox.
            key = f"{node.socket}/k8s.io/{cid}".encode()
            (SHIM_SOCKETS / hashlib.sha256(key).hexdigest()).unlink(missing_ok=True)


@contextlib.contextmanager
def _tunables_lock() -> Iterator[Path]:
    TUNABLES_DIR.mkdir(parents=True, exist_ok=True)
    with open(TUNABLES_DIR / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield TUNABLES_DIR / "kernel-tunables.json"


def save_kernel_tunables(cfg: ClusterConfig) -> None:
    """Before this cluster's first kubelet starts: remember the sysctls (first cluster only)."""
    with _tunables_lock() as path:
        state = json.loads(path.read_text()) if path.exists() else None
        if state is None:
            values = {k: (Path("/proc/sys") / k).read_text().strip() for k in KERNEL_TUNABLES}
            state = {"values": values, "clusters": []}
        if str(cfg.run_dir) not in state["clusters"]:
            state["clusters"].append(str(cfg.run_dir))
        path.write_text(json.dumps(state, indent=1))


def restore_kernel_tunables(cfg: ClusterConfig) -> None:
    """After this cluster's kubelets stopped: put the sysctls back (and remove containerd's
    empty ``k8s.io`` cgroups) if no other cluster is running."""
    with _tunables_lock() as path:
        if not path.exists():
            return
        state = json.loads(path.read_text())
        state["clusters"] = [
            c
            for c in state["clusters"]
            if c != str(cfg.run_dir) and procs.marked_pids(Path(c))  # others still running
        ]
        if state["clusters"]:
            path.write_text(json.dumps(state, indent=1))
            return
        for key, value in state["values"].items():
            with contextlib.suppress(OSError):
                (Path("/proc/sys") / key).write_text(value)
        path.unlink()
        # containerd's cgroup parent of all containers, left by the first container made:
        # remove it when empty (no other devcluster runs containers now).
        for parent in Path("/sys/fs/cgroup").glob("*/k8s.io"):
            with contextlib.suppress(OSError):
                parent.rmdir()
        logger.debug("kernel tunables restored: %s", state["values"])
