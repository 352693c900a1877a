"""Ports on this machine's loopback interface."""

from __future__ import annotations

import socket


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
