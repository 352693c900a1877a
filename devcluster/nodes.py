"""Real nodes: per node a containerd, a kubelet and a kube-proxy in the node's network namespace.

Each node has a directory ``<run_dir>/nodes/<node>/`` with:

- ``containerd/``: ``config.toml``, ``root/`` (content, snapshots: planted from the image seed
  of :mod:`devcluster.nodeseed`, kept across ``up`` runs while the images stay the same),
  ``state/`` (socket, shim state, runc state, the
  pods' network namespace files: ``netns_mounts_under_state_dir``);
- ``cni/``: the CNI configuration (bridge ``cni0`` + host-local on the node's pod CIDR,
  portmap) and host-local's allocations;
- ``kubelet/``: its configuration, kubeconfig and ``--root-dir`` (pod volumes), and
  ``device-plugins/``: the node's ``/var/lib/kubelet/device-plugins``;
- ``kube-proxy.kubeconfig``;
- ``logs/pods``, ``logs/containers``: the node's ``/var/log/pods`` and ``/var/log/containers``.

The three processes run in the node's network namespace (:func:`devcluster.realnet.in_netns`):
each node has its own addresses, ports and iptables. containerd also gets a mount namespace of
its own (``unshare --mount --propagation slave``: host mounts show inside, its mounts stay
inside), and the kubelet joins it, so a Secret volume the kubelet mounts is what runc
bind-mounts into the container. That namespace exists because a 1.20 kubelet uses fixed host
paths whatever its flags (:data:`NODE_PRIVATE_DIRS`): it keeps container logs in
``/var/log/pods`` and its garbage collector deletes every directory there whose pod it does not
run (the other nodes' logs); its device manager empties ``/var/lib/kubelet/device-plugins`` at
start and listens on ``kubelet.sock`` there (of two kubelets starting together, one dies with
"address already in use", or deletes the other's socket). In the node's mount namespace each
of these paths is a bind mount of the node's own directory, which only its kubelet, containerd
and containers see (a device plugin's hostPath volume too). Everything mounted in that
namespace (overlay root filesystems, volumes, the pods' network namespace files) disappears
with the node's processes; nothing of a node is mounted on the host. Every process carries
the cluster's marker variable; containerd passes it to its shims, so ``down`` finds those too.
Container processes do not carry it: ``down`` finds them through the node's runc state
(:mod:`devcluster.nodeclean`).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from devcluster import pki
from devcluster.build import NodeBinaries
from devcluster.config import ClusterConfig, read_token
from devcluster.noderuntime import ProcessHost
from devcluster.realnet import in_netns

logger = logging.getLogger(__name__)

#: Where Debian's containernetworking-plugins put the CNI plugins.
CNI_BIN_DIR = Path(os.environ.get("DEVCLUSTER_CNI_BIN_DIR", "/usr/lib/cni"))
CLUSTER_DOMAIN = "cluster.local"
#: The fixed host paths of a 1.20 kubelet (whatever its flags) that each node has of its own:
#: the directory of the node's directory bind-mounted there, in the node's mount namespace.
NODE_PRIVATE_DIRS = (
    ("logs/pods", Path("/var/log/pods")),  # container logs
    ("logs/containers", Path("/var/log/containers")),  # links to them
    # The device manager's socket (kubelet.sock), its checkpoint, the device plugins' sockets.
    ("kubelet/device-plugins", Path("/var/lib/kubelet/device-plugins")),
)


#: The prefix of the second names :meth:`RealNode.hold_images` gives the images.
HELD_PREFIX: Final = "devcluster.local/held/"


@dataclass(frozen=True)
class RealNode:
    """Paths, configuration files and command lines of one real node."""

    cfg: ClusterConfig
    index: int

    @property
    def name(self) -> str:
        """The node's name (also its hostname label)."""
        return self.cfg.node_name(self.index)

    @property
    def ip(self) -> str:
        """The node's address (in its namespace)."""
        return self.cfg.realnet.node_ip(self.index)

    @property
    def netns(self) -> str:
        """The node's network namespace."""
        return self.cfg.realnet.netns(self.name)

    @property
    def dir(self) -> Path:
        """The node's directory under the run directory."""
        return self.cfg.nodes_dir / self.name

    @property
    def containerd_dir(self) -> Path:
        """containerd's configuration, root and state."""
        return self.dir / "containerd"

    @property
    def containerd_root(self) -> Path:
        """containerd's root: content, snapshots, metadata (planted from the image seed)."""
        return self.containerd_dir / "root"

    @property
    def socket(self) -> Path:
        """containerd's gRPC socket."""
        return self.containerd_dir / "state" / "containerd.sock"

    @property
    def kubelet_dir(self) -> Path:
        """The kubelet's configuration and --root-dir."""
        return self.dir / "kubelet"

    def private_dirs(self) -> list[tuple[Path, Path]]:
        """(the node's own directory, the fixed host path it is mounted on) for each of
        :data:`NODE_PRIVATE_DIRS`."""
        return [(self.dir / sub, fixed) for sub, fixed in NODE_PRIVATE_DIRS]

    def component(self, what: str) -> str:
        """Process name (pid file key, log file name) of ``what`` on this node."""
        return f"{self.name}-{what}"

    # ----- configuration -------------------------------------------------
    def write_configs(self, pause_image: str) -> None:
        """Write containerd's, CNI's, the kubelet's and kube-proxy's configuration."""
        for sub in ("containerd/root", "containerd/state", "cni/net.d", "kubelet/root"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        for own, fixed in self.private_dirs():
            own.mkdir(parents=True, exist_ok=True)
            fixed.mkdir(parents=True, exist_ok=True)  # the mount point (a kubelet makes it too)
        (self.containerd_dir / "config.toml").write_text(self._containerd_toml(pause_image))
        (self.dir / "cni" / "net.d" / "10-devcluster.conflist").write_text(
            json.dumps(self._cni_conflist(), indent=2)
        )
        (self.kubelet_dir / "config.json").write_text(json.dumps(self._kubelet_config(), indent=2))
        pki.write_kubeconfig(
            self.cfg,
            self.kubelet_dir / "kubeconfig",
            pki.node_user(self.name),
            read_token(self.cfg, pki.node_user(self.name)),
        )
        pki.write_kubeconfig(
            self.cfg,
            self.dir / "kube-proxy.kubeconfig",
            pki.KUBE_PROXY_USER,
            read_token(self.cfg, pki.KUBE_PROXY_USER),
        )

    def _containerd_toml(self, pause_image: str) -> str:
        root = self.containerd_dir
        cri = '[plugins."io.containerd.grpc.v1.cri"'
        return f"""version = 2
root = "{root / "root"}"
state = "{root / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{self.socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{root / "opt"}"

{cri}]
  sandbox_image = "{pause_image}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  enable_selinux = false

{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "{root / "state" / "runc"}"

{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{self.dir / "cni" / "net.d"}"
  max_conf_num = 1
"""

    def _cni_conflist(self) -> dict[str, object]:
        return {
            "cniVersion": "0.4.0",
            # Unique per cluster and node: libcni's cache files under /var/lib/cni carry it.
            "name": self.netns,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.cfg.realnet.pod_cidr(self.index)}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.dir / "cni" / "ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }

    def _kubelet_config(self) -> dict[str, object]:
        cfg = self.cfg
        ca = str(cfg.pki_dir / "ca.crt")
        return {
            "kind": "KubeletConfiguration",
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "address": self.ip,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            "tlsCertFile": str(cfg.pki_dir / "kubelet.crt"),
            "tlsPrivateKeyFile": str(cfg.pki_dir / "kubelet.key"),
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": ca},
            },
            "authorization": {"mode": "Webhook"},
            "podCIDR": cfg.realnet.pod_cidr(self.index),
            "cgroupDriver": "cgroupfs",
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            "failSwapOn": False,
            "clusterDNS": [cfg.realnet.dns_service_ip],
            "clusterDomain": CLUSTER_DOMAIN,
            "maxPods": cfg.node_pods,
            # Heartbeats every 2 s: the controller-manager's grace period is short.
            "nodeLeaseDurationSeconds": 8,
            "nodeStatusUpdateFrequency": "4s",
            "nodeStatusReportFrequency": "20s",
            # Images cannot be pulled again here: never garbage-collect them, and never
            # evict pods because the (shared) disk of this machine fills up.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "50Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "serializeImagePulls": False,
            "volumePluginDir": str(self.kubelet_dir / "volume-plugins"),
            "containerLogMaxSize": "10Mi",
        }

    # ----- command lines -------------------------------------------------
    def containerd_argv(self) -> list[str]:
        """containerd with this node's configuration, in the node's network namespace and a
        mount namespace of its own where the node's private directories are mounted."""
        script = (  # arguments: (own directory, mount point) pairs, then the config file
            'while [ "$#" -gt 1 ]; do mount --bind "$1" "$2" || exit 1; shift 2; done'
            ' && exec containerd --config "$1"'
        )
        return in_netns(
            self.netns,
            "unshare", "--mount", "--propagation", "slave",
            "sh", "-c", script, "containerd",
            *[str(path) for pair in self.private_dirs() for path in pair],
            str(self.containerd_dir / "config.toml"),
        )  # fmt: skip

    def kubelet_argv(self, bins: NodeBinaries, containerd_pid: int) -> list[str]:
        """The kubelet of this node, on its containerd (in containerd's mount namespace)."""
        endpoint = f"unix://{self.socket}"
        return in_netns(
            self.netns,
            str(bins.kubelet),
            f"--config={self.kubelet_dir / 'config.json'}",
            f"--kubeconfig={self.kubelet_dir / 'kubeconfig'}",
            f"--root-dir={self.kubelet_dir / 'root'}",
            f"--cert-dir={self.kubelet_dir / 'pki'}",
            "--container-runtime=remote",
            f"--container-runtime-endpoint={endpoint}",
            f"--image-service-endpoint={endpoint}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.ip}",
            "--v=1",
            mount_of=containerd_pid,
        )

    def kube_proxy_argv(self, bins: NodeBinaries) -> list[str]:
        """kube-proxy (iptables mode) of this node; machine-wide conntrack settings untouched."""
        return in_netns(
            self.netns,
            str(bins.kube_proxy),
            f"--kubeconfig={self.dir / 'kube-proxy.kubeconfig'}",
            f"--hostname-override={self.name}",
            f"--bind-address={self.ip}",
            f"--cluster-cidr={self.cfg.realnet.pod_range}",
            "--proxy-mode=iptables",
            "--conntrack-max-per-core=0",
            "--conntrack-tcp-timeout-established=0",
            "--conntrack-tcp-timeout-close-wait=0",
            "--metrics-bind-address=127.0.0.1:10249",
            "--healthz-bind-address=127.0.0.1:10256",
            "--v=1",
        )

    # ----- containerd ----------------------------------------------------
    def ctr(self, *args: str, timeout: float = 600.0) -> subprocess.CompletedProcess[str]:
        """Run ``ctr`` against this node's containerd in the ``k8s.io`` namespace."""
        return subprocess.run(
            ["ctr", "--address", str(self.socket), "--namespace", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def containerd_ready(self) -> bool:
        """True when containerd answers on its socket."""
        return self.socket.exists() and self.ctr("version", timeout=10).returncode == 0

    def import_image(self, archive: Path) -> None:
        """Import an image archive and unpack it into overlayfs snapshots (the CRI's
        snapshotter), as :mod:`devcluster.nodeseed` does once for every node."""
        result = self.ctr("images", "import", "--snapshotter", "overlayfs", str(archive))
        if result.returncode != 0:
            raise RuntimeError(f"{self.name}: ctr images import {archive}: {result.stderr.strip()}")

    def unpacked_layers(self) -> set[str]:
        """The chain IDs of the image layers unpacked here (committed overlayfs snapshots:
        an image whose layers these are needs none of their blobs)."""
        listed = self._ctr_checked("snapshots", "--snapshotter", "overlayfs", "ls")
        rows = [line.split() for line in listed.splitlines()[1:]]
        return {row[0] for row in rows if row and row[-1] == "Committed"}

    def hold_images(self) -> None:
        """Give every image a second name (under :data:`HELD_PREFIX`), so that each layer
        stays referred to while imports move the first names to new images. Otherwise
        containerd's background collection may remove a layer an import found in place,
        before the import unpacked the layer above it ("parent snapshot ... does not exist"),
        or remove the shared lower layers of a replaced image, to be unpacked again."""
        for name in self._image_names():
            if not name.startswith(HELD_PREFIX):
                self._ctr_checked("images", "tag", "--force", name, HELD_PREFIX + name)

    def release_images(self) -> None:
        """Drop the second names of :meth:`hold_images` and collect, synchronously, the
        content and snapshots no image refers to any more (the replaced images' layers)."""
        held = [name for name in self._image_names() if name.startswith(HELD_PREFIX)]
        if held:
            self._ctr_checked("images", "delete", "--sync", *held)

    def _image_names(self) -> list[str]:
        return self._ctr_checked("images", "list", "--quiet").split()

    def _ctr_checked(self, *args: str) -> str:
        result = self.ctr(*args)
        if result.returncode != 0:
            raise RuntimeError(f"{self.name}: ctr {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout


def real_nodes(cfg: ClusterConfig) -> list[RealNode]:
    """Every node of a real-node cluster."""
    return [RealNode(cfg, i) for i in range(1, cfg.nodes + 1)]


def node_by_name(cfg: ClusterConfig, name: str) -> RealNode:
    """The node called ``name``."""
    for node in real_nodes(cfg):
        if node.name == name:
            return node
    raise KeyError(f"no node {name!r}")


def advertise_extended_resources(host: ProcessHost, nodes: list[str] | None = None) -> None:
    """Add ``extended_resources`` (e.g. nvidia.com/gpu) to the capacity of ``nodes`` (all by
    default), the way a cluster operator advertises them (a patch of the Node status; the
    kubelet then reports them as allocatable). A node that registers again has them no more
    until they are advertised again (``node_add`` does)."""
    for name in nodes if nodes is not None else host.config.node_names():
        patch = [
            {"op": "add", "path": f"/status/capacity/{key.replace('/', '~1')}", "value": value}
            for key, value in host.config.extended_resources.items()
        ]
        if patch:
            host.kubectl(
                "patch", "node", name, "--subresource=status", "--type=json",
                "-p", json.dumps(patch),
            )  # fmt: skip
