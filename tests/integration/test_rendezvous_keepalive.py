"""Kept-alive connections between the workers' client and the rendezvous service, over real
sockets: one connection per calling thread for any number of heartbeats (plain and TLS), a
fresh one once the service has closed an idle one or restarted, and a request that the peer
dropped on a reused connection sent once more on a fresh one (and only then)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from elasticjob.rendezvous.server import RendezvousService
from elasticjob.wire.messages import HeartbeatRequest
from elasticjob.worker_runtime.link.rendezvous_client import RendezvousClient, RendezvousClientError
from tests.support.rendezvous_http import KEY_A, TOKEN_A
from tests.support.rendezvous_jobs import W0, W1, W2, RecordingListener
from tests.support.tls import server_context

DEADLINE = 10.0
"""Upper bound on any wait (a hang fails the test instead)."""
BEATS = 20
BEAT_0 = HeartbeatRequest(hostname=W0.hostname, local_rank=W0.local_rank)
BEAT_1 = HeartbeatRequest(hostname=W2.hostname, local_rank=W2.local_rank)
"""Two slots of one host: the client speaks for that host (its credential)."""


class Served:
    """A service serving ``job-a`` (workers W0, W1 and W2 admitted), not started yet."""

    def __init__(self, header_timeout: float = 1.0) -> None:
        self.service = RendezvousService(header_timeout=header_timeout)
        self.listener = RecordingListener()
        self.service.add_job("job-a", KEY_A, self.listener).readmit([W0, W1, W2])

    @property
    def beats_seen(self) -> int:
        return len(self.listener.heartbeats)

    def client(self) -> RendezvousClient:
        return RendezvousClient(self.service.url, "job-a", TOKEN_A, retry_deadline_s=DEADLINE)


async def served(port: int = 0, header_timeout: float = 1.0) -> Served:
    job = Served(header_timeout)
    await job.service.start("127.0.0.1", port)
    return job


@pytest.fixture
async def job() -> AsyncIterator[Served]:
    job = await served()
    yield job
    await job.service.stop()


@pytest.fixture
def one_thread() -> Iterator[ThreadPoolExecutor]:
    """A pool of one thread: calls run on it keep that thread's connection."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        yield pool


async def on(pool: ThreadPoolExecutor | None, call: Callable[[], None]) -> None:
    """Run ``call`` on ``pool`` (None: the event loop's default pool), within the deadline."""
    await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(pool, call), DEADLINE)


def beats(client: RendezvousClient, request: HeartbeatRequest, count: int) -> Callable[[], None]:
    def send() -> None:
        for _ in range(count):
            client.heartbeat(request)

    return send


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {DEADLINE} s"
        await asyncio.sleep(0.02)


async def test_the_beats_of_one_thread_share_one_connection(
    job: Served, one_thread: ThreadPoolExecutor
) -> None:
    client = job.client()
    await on(one_thread, beats(client, BEAT_0, BEATS))
    assert job.beats_seen == BEATS
    assert job.service.connections.accepted == 1, "one connection for every beat"
    await on(one_thread, client.round_info)  # GETs use it too
    await on(one_thread, beats(client, BEAT_0, BEATS))
    assert job.beats_seen == 2 * BEATS
    assert job.service.connections.accepted == 1 and job.service.connections.open == 1


async def test_threads_never_share_a_connection(job: Served) -> None:
    client = job.client()
    together = threading.Barrier(2, timeout=DEADLINE)

    def beat_together(request: HeartbeatRequest) -> Callable[[], None]:
        def send() -> None:
            together.wait()
            beats(client, request, BEATS)()

        return send

    await asyncio.gather(on(None, beat_together(BEAT_0)), on(None, beat_together(BEAT_1)))
    assert job.beats_seen == 2 * BEATS
    assert job.service.connections.accepted == 2, "one connection per thread"


async def test_a_connection_the_service_closed_while_idle_is_replaced(
    one_thread: ThreadPoolExecutor,
) -> None:
    job = await served(header_timeout=0.3)  # also the service's keep-alive timeout
    try:
        client = job.client()
        await on(one_thread, beats(client, BEAT_0, 1))
        await until(lambda: job.service.connections.open == 0, "idle connection closed")
        started = time.monotonic()
        await on(one_thread, beats(client, BEAT_0, 1))
        assert time.monotonic() - started < 1.0, "replaced at once, not after a retry backoff"
        assert job.beats_seen == 2 and job.service.connections.accepted == 2
    finally:
        await job.service.stop()


async def test_a_restarted_service_gets_a_fresh_connection(
    one_thread: ThreadPoolExecutor,
) -> None:
    first = await served()
    client = first.client()
    await on(one_thread, beats(client, BEAT_0, 3))
    port = first.service.port
    await first.service.stop()
    second = await served(port)
    try:
        started = time.monotonic()
        await on(one_thread, beats(client, BEAT_0, 3))
        assert time.monotonic() - started < 1.0, "not after a retry backoff"
        assert second.beats_seen == 3 and second.service.connections.accepted == 1
    finally:
        await second.service.stop()


async def test_tls_beats_share_one_connection(
    tmp_path: Path, one_thread: ThreadPoolExecutor
) -> None:
    context, ca_pem = server_context(tmp_path)
    job = Served()
    await job.service.start("127.0.0.1", 0, ssl_context=context)
    try:
        client = RendezvousClient(job.service.url, "job-a", TOKEN_A, ca_pem=ca_pem)
        await on(one_thread, beats(client, BEAT_0, BEATS))
        assert job.beats_seen == BEATS
        assert job.service.connections.accepted == 1, "one TLS handshake for every beat"
    finally:
        await job.service.stop()


class DroppingPeer:
    """An HTTP/1.1 peer that answers ``200`` and keeps the connection, except that it closes
    a connection without an answer when ``drop(connection, request)`` (0-based: the
    connection's number, the request's number on it) says so; with ``cut``, it first sends
    the start of an answer whose body never comes."""

    def __init__(self, drop: Callable[[int, int], bool], *, cut: bool = False) -> None:
        self._drop = drop
        self._cut = cut
        self.connections = 0
        self.requests = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection, self.connections = self.connections, self.connections + 1
        try:
            request = 0
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                self.requests += 1
                if self._drop(connection, request):
                    if self._cut:
                        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{")
                        await writer.drain()
                    return
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
                request += 1
        except asyncio.IncompleteReadError:
            return  # the client closed it
        finally:
            writer.close()


async def test_a_request_dropped_on_a_reused_connection_is_sent_once_more_on_a_fresh_one(
    one_thread: ThreadPoolExecutor,
) -> None:
    """The peer closes each connection as its second request arrives: the race of a service
    closing an idle connection just as the next request is sent. Every beat still arrives,
    after one more try on a fresh connection, with no backoff."""
    peer = DroppingPeer(lambda _, request: request > 0)
    async with peer as url:
        client = RendezvousClient(url, "job-a", TOKEN_A, retry_deadline_s=DEADLINE)
        started = time.monotonic()
        await on(one_thread, beats(client, BEAT_0, 5))
        assert time.monotonic() - started < 2.0, "not after a retry backoff"
    assert (peer.connections, peer.requests) == (5, 9), "4 beats dropped once, sent again"


@pytest.mark.parametrize(
    ("answered", "sent"),
    [
        (0, 1),  # a fresh connection dropped: the beat fails, not sent again
        (1, 3),  # answered once, then dropped, and the one more try dropped too: it fails
    ],
)
async def test_a_request_dropped_on_a_fresh_connection_is_not_sent_again(
    one_thread: ThreadPoolExecutor, answered: int, sent: int
) -> None:
    peer = DroppingPeer(lambda connection, request: connection > 0 or request >= answered)
    async with peer as url:
        client = RendezvousClient(url, "job-a", TOKEN_A, retry_deadline_s=DEADLINE)

        def beat_until_it_fails() -> None:
            beats(client, BEAT_0, answered)()
            with pytest.raises(RendezvousClientError, match="unreachable"):
                client.heartbeat(BEAT_0)

        await on(one_thread, beat_until_it_fails)
    assert peer.requests == sent


async def test_an_answer_cut_short_is_a_lost_connection(one_thread: ThreadPoolExecutor) -> None:
    """A service that dies mid-answer: the call fails as if the service were unreachable
    (what a heartbeat thread handles; an ``IncompleteRead`` would have ended it), and the
    next call gets a fresh connection."""
    peer = DroppingPeer(lambda connection, _: connection == 0, cut=True)
    async with peer as url:
        client = RendezvousClient(url, "job-a", TOKEN_A, retry_deadline_s=DEADLINE)

        def cut_then_beat() -> None:
            with pytest.raises(RendezvousClientError, match="unreachable"):
                client.heartbeat(BEAT_0)
            beats(client, BEAT_0, 1)()

        await on(one_thread, cut_then_beat)
    assert (peer.connections, peer.requests) == (2, 2)
