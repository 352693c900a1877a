"""Probing peers: can this worker reach the members the round gave it to probe?

A probe is a TCP connect to the probe listener every worker hosts (:class:`ProbeListener`,
on the port it registered with the rendezvous service), closed as soon as it is made. A
peer is unreachable when the connect is refused, fails, or does not complete within the
timeout (a cut network drops the packets). All peers are probed at once, under one deadline.

Probes never go to a worker's TCPStore server: torch's store server can stall for seconds on
connections that close without a request (measured with torch 2.13: after about 45 of them,
the next store client waited 5 s to connect). During a recovery every member probes rank 0,
whose store the next round forms on, so at 16 ranks forming a round took 25 to 55 s instead
of 0.1 s.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import socket
import threading
import time
from collections.abc import Callable, Sequence

from elasticjob.wire.messages import PeerEndpoint, ProbedPeer
from elasticjob.worker_runtime.diagnostics.log import get_logger

logger = get_logger(__name__)

PROBE_TIMEOUT_S = 1.0
"""Longest a probe waits for a peer to accept (a reachable peer answers within
milliseconds; across hosts a handshake is a round trip)."""


PROBE_BACKLOG = 128
"""Listen queue of a probe listener: probes of a round come at once from its members."""


class ProbeListener:
    """The TCP listener this worker's peers probe, on every address of the host (as the
    TCPStore server listens): a daemon thread accepts each connection and closes it at once."""

    def __init__(self) -> None:
        if socket.has_dualstack_ipv6():
            self._socket = socket.create_server(
                ("", 0), family=socket.AF_INET6, backlog=PROBE_BACKLOG, dualstack_ipv6=True
            )
        else:
            self._socket = socket.create_server(("", 0), backlog=PROBE_BACKLOG)
        self.port: int = self._socket.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name="elasticjob-probes", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:
                return  # closed
            connection.close()

    def close(self) -> None:
        """Stop listening: probes are refused from now on. Idempotent."""
        with contextlib.suppress(OSError):
            self._socket.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        self._socket.close()


def unreachable_peers(
    peers: Sequence[PeerEndpoint], timeout_s: float = PROBE_TIMEOUT_S
) -> list[PeerEndpoint]:
    """The peers a TCP connect to their probe listener does not reach within ``timeout_s``,
    in the given order. A peer without a probe listener (a restart-mode agent) is not probed."""
    deadline = time.monotonic() + timeout_s
    failed: list[PeerEndpoint] = []
    pending: dict[socket.socket, PeerEndpoint] = {}
    with selectors.DefaultSelector() as selector:
        try:
            for peer in peers:
                if peer.probe_port is None:
                    continue
                sock = _start_connect(peer.address, peer.probe_port)
                if sock is None:
                    failed.append(peer)
                    continue
                pending[sock] = peer
                selector.register(sock, selectors.EVENT_WRITE)
            while pending and (left := deadline - time.monotonic()) > 0:
                for key, _ in selector.select(left):
                    done = key.fileobj
                    assert isinstance(done, socket.socket)
                    selector.unregister(done)
                    peer = pending.pop(done)
                    if done.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                        failed.append(peer)
                    done.close()
            failed.extend(pending.values())  # no answer within the deadline
        finally:
            for sock in pending:
                sock.close()
    order = {peer: index for index, peer in enumerate(peers)}
    return sorted(failed, key=order.__getitem__)


def _start_connect(address: str, port: int) -> socket.socket | None:
    """A non-blocking socket connecting to ``address:port``, or None if connecting failed at
    once (the address does not resolve, no route, refused)."""
    try:
        infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        logger.debug("probe of %s:%d: %s", address, port, exc)
        return None
    family, kind, proto, _, resolved = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setblocking(False)
    code = sock.connect_ex(resolved)
    if code in (0, errno.EINPROGRESS):
        return sock
    with contextlib.suppress(OSError):
        sock.close()
    logger.debug("probe of %s:%d: %s", address, port, errno.errorcode.get(code))
    return None


class PeerProber:
    """Probes the peers of the round this worker joined last, once the training thread has
    been blocked on the round's group (``blocked_for``: seconds, None when not blocked) for
    ``probe_after_s`` (0: never), or at once after a collective of that round failed here
    (:meth:`collective_failed`: a dead peer's connections reset before the driver hears of
    its exit; its listener refuses the probe). :meth:`probe` runs on the heartbeat thread,
    the other methods on the training thread."""

    def __init__(
        self,
        blocked_for: Callable[[], float | None],
        probe_after_s: float,
        timeout_s: float = PROBE_TIMEOUT_S,
    ) -> None:
        self._blocked_for = blocked_for
        self._probe_after_s = probe_after_s
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._round = 0
        self._failed_round = 0
        self._peers: tuple[PeerEndpoint, ...] = ()
        self._last: tuple[ProbedPeer, ...] | None = None

    def joined_round(self, round_number: int, peers: Sequence[PeerEndpoint]) -> None:
        """The worker joins ``round_number``, whose service gave it ``peers`` to probe."""
        with self._lock:
            self._round, self._peers = round_number, tuple(peers)

    def collective_failed(self, round_number: int) -> None:
        """A collective of ``round_number`` failed on this worker: probe its peers now."""
        with self._lock:
            self._failed_round = max(self._failed_round, round_number)

    def probe(self) -> tuple[int, tuple[ProbedPeer, ...]] | None:
        """The round and its peers that did not answer, once blocked long enough or after a
        failed collective of the round; None otherwise or when nobody is to be probed."""
        blocked = self._blocked_for()
        with self._lock:
            round_number, peers = self._round, self._peers
            failed = self._failed_round == round_number
        if self._probe_after_s <= 0:
            return None
        if not failed and (blocked is None or blocked < self._probe_after_s):
            self._last = None
            return None
        if not peers:
            return None
        unreachable = tuple(
            ProbedPeer(hostname=peer.hostname, local_rank=peer.local_rank)
            for peer in unreachable_peers(peers, self._timeout_s)
        )
        if unreachable != self._last:
            logger.warning(
                "round %d: %s; peers that do not answer: %s",
                round_number,
                "a collective failed" if failed else f"blocked for {blocked:.1f} s",
                ", ".join(f"{p.hostname}[{p.local_rank}]" for p in unreachable) or "none",
            )
        self._last = unreachable
        return round_number, unreachable
