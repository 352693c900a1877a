"""A worker's side of partition detection: how long the training thread has been blocked on
its round's group, probing peers with real TCP connects (a listener, a closed port, a
listener that accepts nothing more), and heartbeats that carry what the probes found."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
import torch

from elasticjob.wire.messages import PeerEndpoint, ProbedPeer
from elasticjob.worker_contract import ENV_PROBE_AFTER, WorkerConfig
from elasticjob.worker_runtime.link.heartbeat import Heartbeat
from elasticjob.worker_runtime.link.reachability import PeerProber, ProbeListener, unreachable_peers
from elasticjob.worker_runtime.link.rendezvous_client import RendezvousClient
from elasticjob.worker_runtime.rounds.process_group import RoundGroup
from tests.support.loopback import closed_port
from tests.support.worker_env import FULL_ENV

DEADLINE_S = 10.0


def peer(name: str, port: int, store_port: int = 1) -> PeerEndpoint:
    """A peer whose probe listener is on ``port``."""
    return PeerEndpoint(
        hostname=name, local_rank=0, address="127.0.0.1", store_port=store_port, probe_port=port
    )


@contextlib.contextmanager
def listening(backlog: int = 16) -> Iterator[socket.socket]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(backlog)
        yield sock


@contextlib.contextmanager
def saturated() -> Iterator[int]:
    """A listener whose accept queue is full: the kernel drops further SYNs, as a cut
    network does, so a connect neither succeeds nor is refused."""
    with listening(backlog=0) as server:
        port = int(server.getsockname()[1])
        fillers: list[socket.socket] = []
        try:
            for _ in range(4):
                filler = socket.socket()
                filler.setblocking(False)
                filler.connect_ex(("127.0.0.1", port))
                fillers.append(filler)  # on loopback the handshake is done within connect
            yield port
        finally:
            for filler in fillers:
                filler.close()


def test_unreachable_peers_are_those_that_refuse_or_do_not_answer_in_time() -> None:
    with listening() as up, saturated() as stalled:
        peers = [
            peer("up", int(up.getsockname()[1])),
            peer("refused", closed_port()),
            peer("stalled", stalled),
        ]
        started = time.monotonic()
        found = unreachable_peers(peers, timeout_s=0.5)
        elapsed = time.monotonic() - started
    assert [p.hostname for p in found] == ["refused", "stalled"]
    assert 0.45 <= elapsed < 2.0, f"one deadline for all probes, took {elapsed:.2f} s"


def test_reachable_peers_are_answered_at_once() -> None:
    with listening() as a, listening() as b:
        peers = [peer("a", int(a.getsockname()[1])), peer("b", int(b.getsockname()[1]))]
        started = time.monotonic()
        assert unreachable_peers(peers, timeout_s=5.0) == []
        assert time.monotonic() - started < 1.0


def test_an_unresolvable_address_is_unreachable() -> None:
    bad = PeerEndpoint(
        hostname="x", local_rank=0, address="no-such-host.invalid", store_port=1, probe_port=1
    )
    assert unreachable_peers([bad], timeout_s=0.5) == [bad]


def accepted(server: socket.socket) -> int:
    """How many connections wait in ``server``'s accept queue (taken off it)."""
    server.setblocking(False)
    count = 0
    with contextlib.suppress(BlockingIOError):
        while True:
            server.accept()[0].close()
            count += 1
    return count


def test_probes_go_to_the_probe_listener_never_to_the_store() -> None:
    """A store server can stall for seconds on connections that close without a request:
    probes connect to the peer's probe listener only."""
    with listening() as probes, listening() as store:
        target = peer("p", int(probes.getsockname()[1]), int(store.getsockname()[1]))
        for _ in range(5):
            assert unreachable_peers([target], timeout_s=5.0) == []
        assert accepted(store) == 0
        assert accepted(probes) == 5


def test_a_peer_without_a_probe_listener_is_not_probed() -> None:
    """A worker without a probe listener (a restart-mode agent) registered no probe port: it
    is neither probed nor reported."""
    with listening() as store:
        old = PeerEndpoint(
            hostname="old", local_rank=0, address="127.0.0.1", store_port=store.getsockname()[1]
        )
        gone = peer("gone", closed_port())
        assert unreachable_peers([old, gone], timeout_s=0.5) == [gone]
        assert accepted(store) == 0


def sockets_at(port: int) -> int:
    """How many of this process's descriptors are TCP sockets with ``port`` at either end: the
    listener's own socket on it, the connections it accepted and has not closed, and probes to
    it not closed yet. Whatever other tests' threads open or close is left out."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError):
            for row in Path(table).read_text().splitlines()[1:]:
                fields = row.split()  # sl, local address, remote address, ..., inode
                if port in {int(end.rsplit(":", 1)[1], 16) for end in fields[1:3]}:
                    inodes.add(f"socket:[{fields[9]}]")
    held = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed since the listing
            held += os.readlink(f"/proc/self/fd/{fd}") in inodes
    return held


def test_the_probe_listener_answers_every_probe_and_holds_no_connection() -> None:
    listener = ProbeListener()
    try:
        target = peer("me", listener.port)
        assert unreachable_peers([target], timeout_s=5.0) == []
        before = sockets_at(listener.port)
        assert before >= 1, "the listening socket itself"
        for _ in range(200):
            assert unreachable_peers([target], timeout_s=5.0) == []
        deadline = time.monotonic() + DEADLINE_S
        while sockets_at(listener.port) > before and time.monotonic() < deadline:
            time.sleep(0.01)  # the accepting thread closes the last one
        assert sockets_at(listener.port) <= before
    finally:
        listener.close()
    assert unreachable_peers([target], timeout_s=0.5) == [target], "closed: probes refused"


def test_the_group_tells_how_long_the_training_thread_has_been_blocked() -> None:
    group = RoundGroup("gloo", torch.device("cpu"))
    assert group.blocked_for() is None
    with group.blocking():
        time.sleep(0.05)
        with group.blocking():
            outer = group.blocked_for()
        assert outer is not None and outer >= 0.05, "nested operations count from the first"
    assert group.blocked_for() is None


class _Work:
    """An asynchronous collective that completes when the test says so."""

    def __init__(self) -> None:
        self.future: torch.futures.Future[object] = torch.futures.Future()

    def get_future(self) -> torch.futures.Future[object]:
        return self.future

    def wait(self) -> bool:
        return True


def test_a_collective_being_waited_on_counts_as_blocked() -> None:
    group = RoundGroup("gloo", torch.device("cpu"))
    work = _Work()
    waiter = threading.Thread(target=group.wait, args=(work,))
    waiter.start()
    deadline = time.monotonic() + DEADLINE_S
    while group.blocked_for() is None and time.monotonic() < deadline:
        time.sleep(0.01)  # polling the state another thread sets; bounded
    assert group.blocked_for() is not None
    work.future.set_result(None)
    waiter.join(DEADLINE_S)
    assert not waiter.is_alive() and group.blocked_for() is None


@pytest.mark.parametrize(
    ("blocked", "probe_after", "has_peers", "failed_round", "reports"),
    [
        (None, 2.0, True, None, False),
        (1.0, 2.0, True, None, False),
        (2.5, 0.0, True, None, False),
        (2.5, 2.0, False, None, False),
        (2.5, 2.0, True, None, True),
        (None, 2.0, True, 7, True),
        (None, 2.0, True, 6, False),
        (None, 0.0, True, 7, False),
    ],
    ids=[
        "not-blocked",
        "not-long-enough",
        "probing-off",
        "nobody-to-probe",
        "probes",
        "a-collective-of-the-round-failed",
        "a-collective-of-an-older-round-failed",
        "failed-but-probing-off",
    ],
)
def test_the_prober_probes_once_blocked_long_enough_or_after_a_failed_collective(
    blocked: float | None,
    probe_after: float,
    has_peers: bool,
    failed_round: int | None,
    reports: bool,
) -> None:
    with listening() as up:
        peers = [peer("up", int(up.getsockname()[1])), peer("down", closed_port())]
        prober = PeerProber(lambda: blocked, probe_after, timeout_s=0.5)
        if failed_round is not None:
            prober.collective_failed(failed_round)
        prober.joined_round(7, peers if has_peers else [])
        found = prober.probe()
    if reports:
        assert found == (7, (ProbedPeer(hostname="down", local_rank=0),))
    else:
        assert found is None


class _Recording(http.server.BaseHTTPRequestHandler):
    bodies: ClassVar[list[dict[str, object]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.bodies.append(json.loads(body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_heartbeats_carry_the_probe_report() -> None:
    _Recording.bodies.clear()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recording)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    reports = iter([None, (3, (ProbedPeer(hostname="b", local_rank=1),))])
    client = RendezvousClient(f"http://127.0.0.1:{server.server_port}", "demo", "secret")
    heartbeat = Heartbeat(client, "a", 0, 0.05, probe=lambda: next(reports, None))
    try:
        heartbeat.start()
        deadline = time.monotonic() + DEADLINE_S
        while len(_Recording.bodies) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)  # beats arrive on the heartbeat thread's schedule; bounded
    finally:
        heartbeat.stop()
        server.shutdown()
        server.server_close()
    quiet = {
        "hostname": "a",
        "local_rank": 0,
        "round": None,
        "unreachable": [],
        "pace": None,
        "held_shards": None,
    }
    assert _Recording.bodies[:3] == [
        quiet,
        {**quiet, "round": 3, "unreachable": [{"hostname": "b", "local_rank": 1}]},
        quiet,
    ]


def test_a_beat_asked_for_is_sent_at_once() -> None:
    _Recording.bodies.clear()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recording)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = RendezvousClient(f"http://127.0.0.1:{server.server_port}", "demo", "secret")
    heartbeat = Heartbeat(client, "a", 0, 60.0)
    try:
        heartbeat.start()
        deadline = time.monotonic() + DEADLINE_S
        while not _Recording.bodies and time.monotonic() < deadline:
            time.sleep(0.01)  # the first beat is sent at once; bounded
        assert len(_Recording.bodies) == 1
        heartbeat.beat_now()
        while len(_Recording.bodies) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)  # bounded; the next scheduled beat is a minute away
    finally:
        heartbeat.stop()
        server.shutdown()
        server.server_close()
    assert len(_Recording.bodies) == 2, "beat_now() did not send a beat before the schedule"


def test_the_probe_threshold_comes_from_the_environment() -> None:
    config = WorkerConfig.from_env(FULL_ENV | {ENV_PROBE_AFTER: "0.5"})
    assert config is not None and config.probe_after_s == 0.5
    default = WorkerConfig.from_env(FULL_ENV)
    assert default is not None and default.probe_after_s == 2.0
