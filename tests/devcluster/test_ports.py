"""The control-plane ports of a private cluster (``devcluster/config.py``): each cluster's
from a block of its own, below the kernel's ephemeral range, so that no ``bind(0)`` or
outgoing connection elsewhere on the machine takes one before its component binds it (an
etcd once found its port taken after the image build that came between)."""

from __future__ import annotations

import socket
from pathlib import Path

from devcluster.config import COMPONENT_PORTS, NETS, ClusterConfig, component_ports

EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


def test_every_clusters_ports_lie_apart_and_below_the_ephemeral_range() -> None:
    low = int(EPHEMERAL.read_text().split()[0])
    seen: set[int] = set()
    for real in (False, True):
        for net in (0, 1, NETS - 1):
            ports = set(component_ports(net, real=real).values())
            assert len(ports) == len(COMPONENT_PORTS)
            assert max(ports) < low, (net, real, sorted(ports))
            assert not ports & seen, (net, real)
            seen |= ports


def test_a_port_in_use_is_passed_over(tmp_path: Path) -> None:
    first = component_ports(7, real=True)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", first["apiserver_port"]))
        taken.listen()
        cfg = ClusterConfig.private(tmp_path, 7, runtime="containerd")
    chosen = {name: getattr(cfg, name) for name in COMPONENT_PORTS}
    assert first["apiserver_port"] not in chosen.values()
    assert len(set(chosen.values())) == len(COMPONENT_PORTS)
