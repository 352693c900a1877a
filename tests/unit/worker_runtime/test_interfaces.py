"""The interface Gloo and NCCL use (``interfaces.py``): the lookup's table, what is set, and
this machine's own loopback."""

from __future__ import annotations

import ipaddress

import pytest

from elasticjob.library_env import ENV_GLOO_SOCKET_IFNAME, ENV_NCCL_SOCKET_IFNAME
from elasticjob.worker_runtime.rounds.interfaces import (
    InterfaceAddress,
    interface_for_address,
    local_interfaces,
    pin_socket_interfaces,
    socket_ifname_env,
)


def iface(name: str, address: str) -> InterfaceAddress:
    return InterfaceAddress(name, ipaddress.ip_interface(address))


POD = [
    iface("lo", "127.0.0.1/8"),
    iface("lo", "::1/128"),
    iface("eth0", "10.244.1.5/24"),
    iface("eth0", "fd00::5/64"),
    iface("net1", "192.168.7.20/24"),
    iface("tun0", "10.0.0.1/8"),
]


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        pytest.param("10.244.1.5", "eth0", id="pod-ip"),
        pytest.param("192.168.7.20", "net1", id="secondary-network"),
        pytest.param("127.0.0.1", "lo", id="loopback"),
        pytest.param("127.0.1.7", "lo", id="loopback-network"),
        pytest.param("10.244.1.9", "eth0", id="narrowest-network-wins"),
        pytest.param("fd00::5", "eth0", id="ipv6"),
        pytest.param("::1", "lo", id="ipv6-loopback"),
        pytest.param("172.16.0.1", None, id="on-no-interface"),
        pytest.param("fd01::1", None, id="ipv6-on-no-interface"),
        pytest.param("pod-a", None, id="not-an-address"),
    ],
)
def test_interface_for_address(address: str, expected: str | None) -> None:
    assert interface_for_address(address, POD) == expected


@pytest.mark.parametrize(
    ("environ", "interface", "expected"),
    [
        pytest.param(
            {},
            "eth0",
            {ENV_GLOO_SOCKET_IFNAME: "eth0", ENV_NCCL_SOCKET_IFNAME: "eth0"},
            id="both-unset",
        ),
        pytest.param(
            {ENV_NCCL_SOCKET_IFNAME: "ib0"},
            "eth0",
            {ENV_GLOO_SOCKET_IFNAME: "eth0"},
            id="user-choice-wins",
        ),
        pytest.param(
            {ENV_GLOO_SOCKET_IFNAME: "", ENV_NCCL_SOCKET_IFNAME: "=eth1"},
            "eth0",
            {ENV_GLOO_SOCKET_IFNAME: "eth0"},
            id="empty-counts-as-unset",
        ),
        pytest.param({}, None, {}, id="no-interface"),
    ],
)
def test_socket_ifname_env(
    environ: dict[str, str], interface: str | None, expected: dict[str, str]
) -> None:
    assert socket_ifname_env(environ, interface) == expected


def test_this_machines_loopback_carries_every_loopback_address() -> None:
    assert iface("lo", "127.0.0.1/8") in local_interfaces()
    environ = {ENV_NCCL_SOCKET_IFNAME: "eth7"}
    assert pin_socket_interfaces("127.0.1.7", environ) == {ENV_GLOO_SOCKET_IFNAME: "lo"}
    assert environ == {ENV_GLOO_SOCKET_IFNAME: "lo", ENV_NCCL_SOCKET_IFNAME: "eth7"}
    assert pin_socket_interfaces("localhost", {}) == {
        ENV_GLOO_SOCKET_IFNAME: "lo",
        ENV_NCCL_SOCKET_IFNAME: "lo",
    }
    assert pin_socket_interfaces("no-such-host.invalid", {}) == {}, "unresolved: nothing set"
