"""The real-node address plan and the DNS records, without a cluster."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from devcluster.clusterdns import records
from devcluster.config import ClusterConfig, RealNet

pytestmark = pytest.mark.devcluster


def test_every_net_has_its_own_private_block_and_short_names() -> None:
    blocks = set()
    for net in range(220):
        plan = RealNet(net)
        block = ipaddress.ip_network(plan.block)
        assert block.is_private and block not in blocks
        blocks.add(block)
        assert not block.overlaps(ipaddress.ip_network("10.0.0.0/24"))  # process Services
        subnets = [plan.service_cidr, plan.pod_range, f"{plan.bridge_ip}/24"]
        for a in subnets:
            assert ipaddress.ip_network(a, strict=False).subnet_of(block)  # type: ignore[arg-type]
        assert not ipaddress.ip_network(plan.service_cidr).overlaps(
            ipaddress.ip_network(plan.pod_range)
        )
        for index in range(1, 100):
            assert len(plan.veth(index)) <= 15
            assert ipaddress.ip_network(plan.pod_cidr(index)).subnet_of(
                ipaddress.ip_network(plan.pod_range)  # type: ignore[arg-type]
            )
        assert len(plan.bridge) <= 15


def test_the_config_follows_the_runtime() -> None:
    real = ClusterConfig(run_dir=Path("/nonexistent"), runtime="containerd", net=3)
    process = ClusterConfig(run_dir=Path("/nonexistent"), net=3)
    assert (real.nodes, process.nodes) == (3, 4)
    assert real.server.startswith(f"https://{real.realnet.bridge_ip}:")
    assert process.server.startswith("https://127.0.0.1:")
    assert real.node_ip(2) == "10.19.0.12" and process.node_ip(2) == "127.3.2.1"
    assert real.service_cidr == "10.19.96.0/24" and process.service_cidr == "10.0.0.0/24"
    with pytest.raises(ValueError):
        ClusterConfig(runtime="docker")


def test_dns_records_of_clusterip_headless_and_externalname_services() -> None:
    services = {
        "a/web": {"spec": {"clusterIP": "10.16.96.7"}},
        "a/peers": {"spec": {"clusterIP": "None"}},
        "b/out": {"spec": {"type": "ExternalName", "externalName": "example.org"}},
    }
    endpoints = {
        "a/web": {"subsets": [{"addresses": [{"ip": "10.16.129.2"}]}]},
        "a/peers": {
            "subsets": [
                {
                    "addresses": [{"ip": "10.16.129.3", "hostname": "w-0"}, {"ip": "10.16.130.4"}],
                    "notReadyAddresses": [{"ip": "10.16.131.5"}],
                }
            ]
        },
    }
    assert sorted(records(services, endpoints)) == [
        ("10.16.129.3", "peers.a.svc.cluster.local"),
        ("10.16.129.3", "w-0.peers.a.svc.cluster.local"),
        ("10.16.130.4", "peers.a.svc.cluster.local"),
        ("10.16.96.7", "web.a.svc.cluster.local"),
    ]
