"""The network interface Gloo and NCCL use: the one that carries the worker's bind address.

Left to themselves, Gloo binds to whatever the machine's host name resolves to and NCCL picks
the first interface that is not loopback or a container bridge; in a pod with several
interfaces (a secondary network, a sidecar's tunnel) either may pick one the peers cannot
reach. At start the runtime therefore sets ``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME`` to
the interface that carries its bind address (``ELASTICJOB_BIND_ADDRESS``: the pod IP under the
operator, the host's address under ``elasticjob-run``), unless they are set already (by the
pod template, the user, or ``elasticjob-run --network-interfaces``), before any group exists.

:func:`interface_for_address` and :func:`socket_ifname_env` decide from plain values;
:func:`local_interfaces` reads this network namespace's interfaces (``socket.if_nameindex()``
and an ioctl per interface for IPv4, ``/proc/net/if_inet6`` for IPv6).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import socket
import struct
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

from elasticjob.library_env import ENV_GLOO_SOCKET_IFNAME, ENV_NCCL_SOCKET_IFNAME

_SIOCGIFADDR = 0x8915
_SIOCGIFNETMASK = 0x891B
_IF_INET6 = Path("/proc/net/if_inet6")

IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface


@dataclass(frozen=True)
class InterfaceAddress:
    """One address of a network interface, with its network (``10.244.1.5/24``)."""

    name: str
    address: IPInterface


def interface_for_address(address: str, interfaces: Iterable[InterfaceAddress]) -> str | None:
    """The interface that carries ``address`` (an IP literal): the one that has it, else the
    one whose network holds it, the narrowest (``127.0.1.7`` is on ``lo``, ``127.0.0.1/8``);
    None when none does or ``address`` is not an IP address."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return None
    candidates = [i for i in interfaces if i.address.version == ip.version]
    for interface in candidates:
        if interface.address.ip == ip:
            return interface.name
    holding = [i for i in candidates if ip in i.address.network]
    if not holding:
        return None
    return max(holding, key=lambda i: i.address.network.prefixlen).name


def socket_ifname_env(environ: Mapping[str, str], interface: str | None) -> dict[str, str]:
    """The variables to add for ``interface``: ``GLOO_SOCKET_IFNAME`` and
    ``NCCL_SOCKET_IFNAME``, each unless ``environ`` sets it already (the user's choice wins);
    nothing without an interface."""
    if interface is None:
        return {}
    names = (ENV_GLOO_SOCKET_IFNAME, ENV_NCCL_SOCKET_IFNAME)
    return {name: interface for name in names if not environ.get(name)}


def local_interfaces() -> list[InterfaceAddress]:
    """The interfaces of this network namespace with their addresses (an interface's
    secondary IPv4 addresses are not listed: the ioctl gives its primary one)."""
    found: list[InterfaceAddress] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _index, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            with contextlib.suppress(OSError):
                address = socket.inet_ntoa(fcntl.ioctl(sock, _SIOCGIFADDR, request)[20:24])
                netmask = socket.inet_ntoa(fcntl.ioctl(sock, _SIOCGIFNETMASK, request)[20:24])
                network = ipaddress.IPv4Interface(f"{address}/{netmask}")
                found.append(InterfaceAddress(name, network))
    with contextlib.suppress(OSError):
        for line in _IF_INET6.read_text().splitlines():
            fields = line.split()
            if len(fields) < 6:
                continue
            hex_address, prefix, name = fields[0], int(fields[2], 16), fields[5]
            text = ":".join(hex_address[i : i + 4] for i in range(0, 32, 4))
            found.append(InterfaceAddress(name, ipaddress.IPv6Interface(f"{text}/{prefix}")))
    return found


def _addresses(host: str) -> list[str]:
    """``host`` if it is an IP literal, else the addresses it resolves to."""
    try:
        return [str(ipaddress.ip_address(host))]
    except ValueError:
        pass
    with contextlib.suppress(OSError):
        return list(dict.fromkeys(str(info[4][0]) for info in socket.getaddrinfo(host, None)))
    return []


def pin_socket_interfaces(
    bind_address: str, environ: MutableMapping[str, str] = os.environ
) -> dict[str, str]:
    """Set ``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME`` in ``environ`` to the interface
    that carries ``bind_address`` (a name is resolved first), each unless set already; return
    what was set (nothing when no interface carries it)."""
    interfaces = local_interfaces()
    for address in _addresses(bind_address):
        interface = interface_for_address(address, interfaces)
        if interface is not None:
            pinned = socket_ifname_env(environ, interface)
            environ.update(pinned)
            return pinned
    return {}
