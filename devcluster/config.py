"""Cluster configuration and on-disk layout of a devcluster run directory.

Everything a running cluster needs to know about itself is written to
``<run_dir>/config.json`` by ``up``; the node agent, the CLI and the pytest
fixtures read it back from there.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import socket
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

logger = logging.getLogger(__name__)

#: Environment variable set on every process a cluster starts (control plane,
#: agent, pod processes); ``down`` uses it to find stragglers.
MARKER_ENV = "DEVCLUSTER_RUN_DIR"

REPO_ROOT = Path(__file__).resolve().parent.parent

#: Node runtimes: the node agent (pods as host processes) or real kubelets on containerd.
RUNTIMES = ("process", "containerd")
#: Default node count per runtime (``ClusterConfig.nodes == 0`` picks it).
DEFAULT_NODES = {"process": 4, "containerd": 3}
#: Real nodes of cluster ``net`` live in 10.<REAL_NET_BASE + net>.0.0/16 (see :class:`RealNet`).
REAL_NET_BASE = 16


def default_run_dir() -> Path:
    """The run directory used when none is given: outside the checkout."""
    if env := os.environ.get("DEVCLUSTER_RUN_DIR"):
        return Path(env)
    base = os.environ.get("XDG_RUNTIME_DIR") or "/tmp"
    return Path(base) / "elasticjob-devcluster"


def default_cache_dir() -> Path:
    """Where built binaries are cached, keyed by version (shared by all runs)."""
    if env := os.environ.get("DEVCLUSTER_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "elasticjob" / "devcluster"


def project_venv() -> Path | None:
    """The project's virtualenv, whose bin/ runs the project's images."""
    if sys.prefix != sys.base_prefix:
        return Path(sys.prefix)
    candidate = REPO_ROOT / ".venv"
    return candidate if (candidate / "bin" / "python").exists() else None


@dataclass(frozen=True)
class RealNet:
    """Addresses and interface names of a real-node (containerd) cluster.

    Everything lies in one private block 10.<16 + net>.0.0/16, so clusters with different
    ``net`` values never overlap, nor overlap the process runtime (127.<net>.x.y, Services in
    10.0.0.0/24):

    - 10.B.0.0/24: the host bridge (``.1``, where the API server and cluster DNS listen) and
      node ``i`` at ``.(10 + i)``, each node in its own network namespace;
    - 10.B.96.0/24: Service ClusterIPs (``.1`` the ``kubernetes`` Service, ``.10`` cluster DNS);
    - 10.B.128.0/17: pod addresses, node ``i`` owning 10.B.(128 + i).0/24.
    """

    net: int

    @property
    def block(self) -> str:
        """The whole /16 of this cluster."""
        return f"10.{REAL_NET_BASE + self.net}.0.0/16"

    def _ip(self, third: int, fourth: int) -> str:
        return f"10.{REAL_NET_BASE + self.net}.{third}.{fourth}"

    @property
    def bridge_ip(self) -> str:
        """The host end of the node network (root namespace)."""
        return self._ip(0, 1)

    @property
    def node_prefix(self) -> int:
        """Prefix length of the node network."""
        return 24

    def node_ip(self, index: int) -> str:
        """Address of node ``index`` (1-based) in its namespace."""
        return self._ip(0, 10 + index)

    @property
    def service_cidr(self) -> str:
        """The API server's --service-cluster-ip-range."""
        return self._ip(96, 0) + "/24"

    @property
    def api_service_ip(self) -> str:
        """ClusterIP of the ``kubernetes`` Service (first of the range)."""
        return self._ip(96, 1)

    @property
    def dns_service_ip(self) -> str:
        """ClusterIP of the cluster DNS Service (``kube-system/kube-dns``)."""
        return self._ip(96, 10)

    @property
    def pod_range(self) -> str:
        """Every pod address of the cluster (kube-proxy's --cluster-cidr)."""
        return self._ip(128, 0) + "/17"

    def pod_cidr(self, index: int) -> str:
        """Pod addresses of node ``index``."""
        return self._ip(128 + index, 0) + "/24"

    def netns(self, node: str) -> str:
        """Name of a node's network namespace (``ip netns``)."""
        return f"devcluster{self.net}-{node}"

    @property
    def bridge(self) -> str:
        """Name of the host bridge (at most 15 characters)."""
        return f"ejbr{self.net}"

    def veth(self, index: int) -> str:
        """Host end of node ``index``'s veth pair (its namespace end is ``eth0``)."""
        return f"ejv{self.net}n{index}"

    def contains(self, address: str) -> bool:
        """True if ``address`` (an IP or a network) overlaps this cluster's block."""
        block = ipaddress.ip_network(self.block)
        other = ipaddress.ip_network(address, strict=False)
        return other.version == 4 and block.overlaps(other)


@dataclass
class ClusterConfig:
    """Settings of one cluster; serialised to ``config.json`` in the run directory."""

    run_dir: Path = field(default_factory=default_run_dir)
    #: "process" (node agent, pods as host processes) or "containerd" (real kubelets).
    runtime: str = "process"
    #: Number of nodes; 0 picks the runtime's default (4 process nodes, 3 real ones).
    nodes: int = 0
    node_cpu: str = "4"
    node_memory: str = "8Gi"
    node_pods: int = 110
    #: Extended resources every node advertises, e.g. {"nvidia.com/gpu": "2"}.
    extended_resources: dict[str, str] = field(default_factory=dict)
    #: Second octet of node and pod addresses: node i is 127.<net>.<i>.1 and
    #: its pods get 127.<net>.<i>.2 ... 127.<net>.<i>.254.
    net: int = 0
    apiserver_port: int = 6443
    etcd_port: int = 2379
    etcd_peer_port: int = 2380
    controller_manager_port: int = 10257
    scheduler_port: int = 10259
    kubelet_port: int = 10250
    #: How often the agent renews each node's Lease.
    heartbeat_seconds: float = 2.0
    #: Node-lifecycle controller: a node whose heartbeats stop for this long is NotReady.
    node_monitor_grace_seconds: int = 10
    #: Default toleration of not-ready/unreachable taints: pods are evicted this
    #: long after their node went NotReady.
    eviction_toleration_seconds: int = 5
    #: Extra image-name rules, "pattern=kind" (kind: project, python, host).
    image_map: list[str] = field(default_factory=list)
    cache_dir: Path = field(default_factory=default_cache_dir)
    #: If set, the agent stops the whole cluster when this process dies
    #: (test sessions that are killed without running their teardown).
    owner_pid: int | None = None

    def __post_init__(self) -> None:
        if self.runtime not in RUNTIMES:
            raise ValueError(f"runtime must be one of {RUNTIMES}, not {self.runtime!r}")
        if self.nodes == 0:
            self.nodes = DEFAULT_NODES[self.runtime]
        if not 0 <= self.net < NETS:
            raise ValueError(f"net must be in 0..{NETS - 1}, not {self.net}")

    @property
    def real(self) -> bool:
        """True for real nodes (kubelet + containerd)."""
        return self.runtime == "containerd"

    @property
    def realnet(self) -> RealNet:
        """Address plan of the real-node network (meaningful for ``runtime="containerd"``)."""
        return RealNet(self.net)

    @property
    def api_host(self) -> str:
        """Where the API server listens: loopback, or the host bridge for real nodes."""
        return self.realnet.bridge_ip if self.real else "127.0.0.1"

    @property
    def service_cidr(self) -> str:
        """The Service ClusterIP range."""
        return self.realnet.service_cidr if self.real else "10.0.0.0/24"

    @classmethod
    def private(cls, run_dir: Path, net: int, **fields: Any) -> ClusterConfig:
        """A cluster that runs beside any other on this machine: its own run directory,
        address block 127.<net>.x.y and free ports for every component, from its net's
        block (:func:`component_ports`)."""
        ports = component_ports(net, real=fields.get("runtime") == "containerd")
        return cls(run_dir=run_dir, net=net, **{**ports, **fields})

    # ----- derived paths -------------------------------------------------
    @property
    def pki_dir(self) -> Path:
        """Certificates, keys and the token file."""
        return self.run_dir / "pki"

    @property
    def logs_dir(self) -> Path:
        """Logs of the control-plane processes and the agent."""
        return self.run_dir / "logs"

    @property
    def pods_dir(self) -> Path:
        """One directory per pod: logs, volumes, hosts file."""
        return self.run_dir / "pods"

    @property
    def bin_dir(self) -> Path:
        """Links to helm and kubectl; put it on PATH."""
        return self.run_dir / "bin"

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig."""
        return self.run_dir / "kubeconfig"

    @property
    def agent_socket(self) -> Path:
        """Unix socket of the node agent's control endpoint (faults)."""
        return self.run_dir / "agent.sock"

    @property
    def server(self) -> str:
        """URL of the API server."""
        return f"https://{self.api_host}:{self.apiserver_port}"

    def node_name(self, index: int) -> str:
        """Name of node ``index`` (1-based)."""
        return f"node-{index}"

    def node_ip(self, index: int) -> str:
        """Address of node ``index`` (1-based); its kubelet endpoint listens there."""
        return self.realnet.node_ip(index) if self.real else f"127.{self.net}.{index}.1"

    @property
    def nodes_dir(self) -> Path:
        """Real nodes: one directory per node (containerd, kubelet, kube-proxy state)."""
        return self.run_dir / "nodes"

    def node_names(self) -> list[str]:
        """All node names."""
        return [self.node_name(i) for i in range(1, self.nodes + 1)]

    # ----- persistence ---------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        data = asdict(self)
        data["run_dir"] = str(self.run_dir)
        data["cache_dir"] = str(self.cache_dir)
        return data

    def save(self) -> None:
        """Write ``config.json`` into the run directory."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        path = self.run_dir / "config.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2))
        tmp.replace(path)

    @classmethod
    def load(cls, run_dir: Path) -> ClusterConfig:
        """Read ``config.json`` from a run directory."""
        data = json.loads((run_dir / "config.json").read_text())
        data["run_dir"] = Path(data["run_dir"])
        data["cache_dir"] = Path(data["cache_dir"])
        return cls(**data)


def read_token(cfg: ClusterConfig, user: str) -> str:
    """The bearer token of ``user`` from the cluster's static token file."""
    for line in (cfg.pki_dir / "tokens.csv").read_text().splitlines():
        parts = line.split(",")
        if len(parts) >= 2 and parts[1] == user:
            return parts[0]
    raise KeyError(f"no token for {user!r}")


PORTS_PER_NET: Final = 16
FIRST_PORT: Final = 20000
"""Where the ports of the process-node cluster of net 0 start; those of real-node clusters
follow the 220 nets' blocks of process-node ones (see :func:`component_ports`)."""
NETS: Final = 220
"""Nets 0..219 (``ClusterConfig.net``)."""
COMPONENT_PORTS: Final = (
    "apiserver_port",
    "etcd_port",
    "etcd_peer_port",
    "controller_manager_port",
    "scheduler_port",
)


def component_ports(net: int, *, real: bool) -> dict[str, int]:
    """A free port for each control-plane component of the cluster of ``net`` (on real nodes
    or not: the two kinds' nets are chosen apart), from a block of :data:`PORTS_PER_NET`
    ports of its own: below the kernel's ephemeral range, from which ``bind(0)`` and every
    outgoing connection take their ports, so that nothing else on the machine takes one
    between now and the moment its component binds it (an image build may come between).
    Ports of the block that are in use are passed over."""
    start = FIRST_PORT + (net + (NETS if real else 0)) * PORTS_PER_NET
    free = [port for port in range(start, start + PORTS_PER_NET) if _is_free(port)]
    if len(free) < len(COMPONENT_PORTS):
        raise RuntimeError(
            f"ports {start}-{start + PORTS_PER_NET - 1} of net {net} are in use: choose another net"
        )
    return dict(zip(COMPONENT_PORTS, free, strict=False))


def _is_free(port: int) -> bool:
    """Whether nothing on this machine listens on or holds ``port`` (any address)."""
    with socket.socket() as probe:
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True
