"""The network of real nodes: a host bridge, one network namespace per node, routes.

Layout (addresses from :class:`~devcluster.config.RealNet`)::

    root namespace                         node-i namespace (devcluster<net>-node-i)
    ejbr<net> 10.B.0.1/24  <--veth-->  eth0 10.B.0.(10+i)/24, no default route
      10.B.(128+i).0/24 via node i           cni0 10.B.(128+i).1/24 (CNI bridge), pods behind
      unreachable 10.B.128.0/17 (pods)       10.B.(128+j).0/24 via node j (host-gw)
      unreachable 10.B.96.0/24 (Services)    ip_forward=1, bridge-nf-call-iptables=1

Node namespaces forward; the root namespace does not need to (nodes share the bridge's L2),
and its unreachable routes keep every packet for a pod or Service address on this machine even
when no node route matches. Node namespaces have no default route: nothing outside the
cluster's block is reachable from a node or a pod, and trying fails at once (a kubelet's cloud
credential probes, a pod's request to the internet) instead of timing out. Each node namespace
has its own iptables, which its kube-proxy and kubelet program; deleting the namespace deletes
them with its veth and CNI bridge.

What :func:`create` makes is recorded in ``<run_dir>/realnet.json`` as it is made, and
:func:`destroy` deletes only what that file lists, so ``down`` after a failed ``up`` removes
exactly what this cluster created and never another cluster's bridge or routes.
"""

from __future__ import annotations

import json
import logging
import subprocess
from pathlib import Path

from devcluster.config import ClusterConfig

logger = logging.getLogger(__name__)

NETNS_DIR = Path("/run/netns")


class NetworkError(RuntimeError):
    """The node network could not be set up."""


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise NetworkError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
    return result


def in_netns(netns: str, *argv: str, mount_of: int | None = None) -> list[str]:
    """``argv`` run in ``netns``'s network namespace, and in the mount namespace of process
    ``mount_of`` if given (else the host's).

    Not ``ip netns exec``: it gives every command its own private mount namespace, and a
    kubelet started that way mounts volumes its containerd never sees.
    """
    mount = [f"--mount=/proc/{mount_of}/ns/mnt"] if mount_of is not None else []
    return ["nsenter", f"--net={NETNS_DIR / netns}", *mount, "--", *argv]


class _Record:
    """Append-only list of what was created, persisted after each step."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.items: list[list[str]] = []
        if path.exists():
            self.items = json.loads(path.read_text())

    def add(self, *item: str) -> None:
        self.items.append(list(item))
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.items))
        tmp.replace(self.path)


def record_path(cfg: ClusterConfig) -> Path:
    """Where :func:`create` lists what it made."""
    return cfg.run_dir / "realnet.json"


def _overlaps(cfg: ClusterConfig) -> list[str]:
    """Host addresses, routes and resolvers that fall into the cluster's block."""
    found: list[str] = []
    addrs = json.loads(_run("ip", "-j", "-4", "addr").stdout or "[]")
    for link in addrs:
        for info in link.get("addr_info", []):
            address = f"{info['local']}/{info['prefixlen']}"
            if cfg.realnet.contains(address):
                found.append(f"address {address} on {link['ifname']}")
    routes = json.loads(_run("ip", "-j", "-4", "route", "show", "table", "all").stdout or "[]")
    for route in routes:
        dst = route.get("dst", "")
        if dst in ("default", "") or route.get("table") == "local":
            continue
        if cfg.realnet.contains(dst):
            found.append(f"route {dst} ({route.get('dev') or route.get('type', '')})")
    resolv = Path("/etc/resolv.conf")
    if resolv.exists():
        for line in resolv.read_text().splitlines():
            parts = line.split()
            is_v4 = len(parts) >= 2 and parts[0] == "nameserver" and ":" not in parts[1]
            if is_v4 and cfg.realnet.contains(parts[1]):
                found.append(f"nameserver {parts[1]}")
    return found


def create(cfg: ClusterConfig) -> None:
    """Create the bridge, every node's namespace and veth, and the routes."""
    net = cfg.realnet
    record = _Record(record_path(cfg))
    clash = _overlaps(cfg)
    if clash:
        raise NetworkError(
            f"the address block {net.block} of cluster net {cfg.net} is in use on this machine "
            f"({'; '.join(clash)}); choose another net"
        )
    if (NETNS_DIR / net.netns(cfg.node_name(1))).exists():
        raise NetworkError(f"network namespaces of net {cfg.net} exist: another cluster uses it")
    _run("ip", "link", "add", net.bridge, "type", "bridge")
    record.add("link", net.bridge)
    _run("ip", "addr", "add", f"{net.bridge_ip}/{net.node_prefix}", "dev", net.bridge)
    _run("ip", "link", "set", net.bridge, "up")
    for i in range(1, cfg.nodes + 1):
        _create_node(cfg, i, record)
    for i in range(1, cfg.nodes + 1):
        _run("ip", "route", "add", net.pod_cidr(i), "via", net.node_ip(i), "dev", net.bridge)
        record.add("route", net.pod_cidr(i))
    for cidr in (net.pod_range, net.service_cidr):
        _run("ip", "route", "add", "unreachable", cidr)
        record.add("route", cidr)
    logger.info("node network %s ready: bridge %s, %d namespaces", net.block, net.bridge, cfg.nodes)


def _create_node(cfg: ClusterConfig, index: int, record: _Record) -> None:
    net = cfg.realnet
    ns = net.netns(cfg.node_name(index))
    _run("ip", "netns", "add", ns)
    record.add("netns", ns)
    veth = net.veth(index)
    _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
    record.add("link", veth)
    _run("ip", "link", "set", veth, "master", net.bridge, "up")
    _run("ip", "-n", ns, "addr", "add", f"{net.node_ip(index)}/{net.node_prefix}", "dev", "eth0")
    _run("ip", "-n", ns, "link", "set", "lo", "up")
    _run("ip", "-n", ns, "link", "set", "eth0", "up")
    for j in range(1, cfg.nodes + 1):
        if j != index:
            _run("ip", "-n", ns, "route", "add", net.pod_cidr(j), "via", net.node_ip(j))
    # Pods on one node talk over its CNI bridge: their replies to a ClusterIP client must
    # pass the node's iptables to be un-DNATed (br_netfilter is per namespace).
    _run(
        *in_netns(
            ns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1",
            "net.bridge.bridge-nf-call-iptables=1",
        )
    )  # fmt: skip


def destroy(cfg: ClusterConfig) -> None:
    """Delete what :func:`create` recorded (in reverse order); missing items are fine.

    Call it after every process in the namespaces has ended.
    """
    path = record_path(cfg)
    if not path.exists():
        return
    record = _Record(path)
    failed = []
    for item in reversed(record.items):
        kind, name = item[0], item[1]
        if kind == "route":
            result = _run("ip", "route", "del", name, check=False)
            gone = result.returncode == 0 or "No such process" in result.stderr
        elif kind == "link":
            result = _run("ip", "link", "del", name, check=False)
            gone = result.returncode == 0 or "Cannot find device" in result.stderr
        else:
            result = _run("ip", "netns", "del", name, check=False)
            gone = result.returncode == 0 or not (NETNS_DIR / name).exists()
        if not gone:
            failed.append(f"{kind} {name}: {result.stderr.strip()}")
    if failed:
        raise NetworkError("could not delete: " + "; ".join(failed))
    path.unlink()
