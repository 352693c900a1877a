"""The hardened rendezvous service over real sockets: refusals that change nothing, the per-job
rate, the protocol version, TLS with a CA made here, slow and malformed connections, and the
token kept out of every log line and repr."""

from __future__ import annotations

import asyncio
import gc
import http.client
import json
import logging
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from cryptography.hazmat.primitives import serialization

from elasticjob.rendezvous.server import GC_THRESHOLDS, RendezvousService
from elasticjob.wire.messages import (
    HeartbeatRequest,
    ProgressRequest,
    RendezvousRequest,
    RoundInfo,
    WorkerId,
)
from elasticjob.wire.protocol import PROTOCOL_HEADER, PROTOCOL_VERSION
from elasticjob.worker_contract import (
    ENV_HOSTNAME,
    ENV_JOB,
    ENV_LOCAL_RANK,
    ENV_RENDEZVOUS_CA,
    ENV_RENDEZVOUS_URL,
    ENV_TOKEN,
    WorkerConfig,
)
from elasticjob.worker_runtime.link import rendezvous_client
from elasticjob.worker_runtime.link.progress import ProgressReporter
from elasticjob.worker_runtime.link.rendezvous_client import RendezvousClient, RendezvousClientError
from tests.support.clock import FakeClock
from tests.support.rendezvous_http import (
    KEY_A,
    KEY_B,
    TOKEN_A,
    TOKEN_B,
    Cluster,
    credential,
    rendezvous_body,
    snapshot,
    started_cluster,
)
from tests.support.rendezvous_jobs import W0, RecordingListener, slots_for
from tests.support.tls import make_ca, server_context

DEADLINE = 10.0
HEARTBEAT_W0 = {"hostname": W0.hostname, "local_rank": W0.local_rank}


BODY_TIMEOUT_S = 1.0


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with started_cluster(
        header_timeout=1.0, body_timeout=BODY_TIMEOUT_S, client_timeout_s=30
    ) as started:
        yield started


# ---- refusals over HTTP ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "body", "status", "words"),
    [
        ("rendezvous", rendezvous_body(WorkerId("planted", 0)), 503, "(yet): retry"),
        ("results", {"hostname": "planted", "local_rank": 0, "state": "SUCCESS"}, 403, "planted"),
        ("heartbeat", {"hostname": "planted", "local_rank": 0}, 403, "planted"),
        ("rendezvous", rendezvous_body(W0, after_round=99), 409, "round 99"),
        ("progress", {"round": 99, "epoch": 0, "step": 0}, 409, "round 99"),
        ("rendezvous", rendezvous_body(W0) | {"local_rank": True}, 422, "local_rank"),
        ("progress", {"round": 0, "epoch": 0, "step": 1.0}, 422, "step"),
    ],
)
async def test_refused_requests_change_nothing(
    cluster: Cluster, route: str, body: dict[str, object], status: int, words: str
) -> None:
    await cluster.rendezvous(W0)
    cluster.job_a.publish_round(1, slots_for([W0]), sync=True)
    before = snapshot(cluster.job_a, cluster.listener_a)
    got, answer = await cluster.call("POST", f"/v1/jobs/job-a/{route}", json=body)
    assert got == status and words in answer["error"], answer
    assert snapshot(cluster.job_a, cluster.listener_a) == before


async def test_an_unknown_worker_before_the_first_round_is_told_to_retry(
    cluster: Cluster,
) -> None:
    before = snapshot(cluster.job_a, cluster.listener_a)
    body = rendezvous_body(WorkerId("planted", 0))
    async with cluster.session.post(
        cluster.service.url + "/v1/jobs/job-a/rendezvous",
        json=body,
        headers={
            "Authorization": f"Bearer {credential('planted')}",
            PROTOCOL_HEADER: str(PROTOCOL_VERSION),
        },
    ) as response:
        assert response.status == 503 and response.headers["Retry-After"] == "1"
        assert "retry" in (await response.json())["error"]
    assert snapshot(cluster.job_a, cluster.listener_a) == before


async def test_repeated_keys_are_400_and_change_nothing(cluster: Cluster) -> None:
    before = snapshot(cluster.job_a, cluster.listener_a)
    data = b'{"hostname": "host-a", "local_rank": 0, "local_rank": 1}'
    status, answer = await cluster.call(
        "POST", "/v1/jobs/job-a/heartbeat", data=data, headers={"Content-Type": "application/json"}
    )
    assert status == 400 and "more than once" in answer["error"]
    assert snapshot(cluster.job_a, cluster.listener_a) == before


async def test_a_changed_store_endpoint_is_409(cluster: Cluster) -> None:
    await cluster.rendezvous(W0)
    body = rendezvous_body(W0) | {"store_port": 31337}
    status, answer = await cluster.call("POST", "/v1/jobs/job-a/rendezvous", json=body)
    assert status == 409 and "cannot change" in answer["error"]


# ---- the per-job rate --------------------------------------------------------------------


async def test_a_job_over_its_rate_gets_429_and_other_jobs_do_not() -> None:
    clock = FakeClock()
    service = RendezvousService(clock=clock)
    small = service.add_job("job-a", KEY_A, RecordingListener(), max_workers=1)
    service.add_job("job-b", KEY_B, RecordingListener(), max_workers=1)
    await service.start("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            cluster = Cluster.__new__(Cluster)
            cluster.service, cluster.session = service, session
            burst = int(small.limits.burst)
            statuses = [
                (await cluster.call("GET", "/v1/jobs/job-a/round"))[0] for _ in range(burst)
            ]
            assert statuses == [200] * burst
            async with session.get(
                service.url + "/v1/jobs/job-a/round",
                headers={
                    "Authorization": f"Bearer {TOKEN_A}",
                    PROTOCOL_HEADER: str(PROTOCOL_VERSION),
                },
            ) as response:
                assert response.status == 429 and response.headers["Retry-After"] == "1"
            status, _ = await cluster.call("GET", "/v1/jobs/job-b/round", token=TOKEN_B)
            assert status == 200, "another job keeps its own rate"
            status, _ = await cluster.call("GET", "/v1/jobs/job-a/round", token="wrong")
            assert status == 403, "requests without the token do not spend the job's rate"

            client = RendezvousClient(service.url, "job-a", TOKEN_A, retry_deadline_s=DEADLINE)
            answer = asyncio.create_task(asyncio.to_thread(client.round_info))
            await asyncio.sleep(0.3)
            assert not answer.done(), "the client waits out the 429"
            clock.now += 1.0
            info = await asyncio.wait_for(answer, DEADLINE)
            assert isinstance(info, RoundInfo)
    finally:
        await service.stop()


async def test_progress_leaves_at_most_once_a_second_the_newest_last(cluster: Cluster) -> None:
    await cluster.rendezvous(W0)
    cluster.job_a.publish_round(1, slots_for([W0]), sync=True)  # progress is rank 0's
    client = RendezvousClient(cluster.service.url, "job-a", TOKEN_A)
    reporter = ProgressReporter(client.report_progress)
    try:
        for step in range(20):
            reporter.offer(ProgressRequest(round=0, epoch=0, step=step))
        deadline = time.monotonic() + DEADLINE
        while not cluster.listener_a.progress or cluster.listener_a.progress[-1].step != 19:
            assert time.monotonic() < deadline, cluster.listener_a.progress
            await asyncio.sleep(0.05)
        assert len(cluster.listener_a.progress) <= 2, "the first, then the newest"
    finally:
        reporter.stop()


# ---- protocol version --------------------------------------------------------------------


def unversioned_request(
    url: str, body: bytes, token: str = TOKEN_A
) -> tuple[int, dict[str, object]]:
    """A worker's request without the protocol header, sent with the standard library."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=DEADLINE)
    try:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        conn.request("POST", "/v1/jobs/job-a/rendezvous", body=body, headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


async def test_a_worker_without_a_protocol_version_is_refused_naming_the_services(
    cluster: Cluster,
) -> None:
    """Refused with 426; only a request with the job's token tells the job (its driver fails
    it: its image is another release's), and nothing else of the job changes."""
    before = snapshot(cluster.job_a, cluster.listener_a)
    body = RendezvousRequest(
        hostname="host-a", local_rank=0, address="10.0.0.1", store_port=29500, wait_seconds=0
    ).model_dump_json()
    status, answer = await asyncio.to_thread(
        unversioned_request, cluster.service.url, body.encode(), "not-the-token"
    )
    assert status == 426
    assert snapshot(cluster.job_a, cluster.listener_a) == before, "no token: nothing told"
    status, answer = await asyncio.to_thread(
        unversioned_request, cluster.service.url, body.encode()
    )
    assert status == 426
    error = str(answer["error"])
    assert f"no {PROTOCOL_HEADER} header" in error and f"speaks {PROTOCOL_VERSION}" in error
    assert cluster.listener_a.incompatible == [error]
    cluster.listener_a.incompatible.clear()
    assert snapshot(cluster.job_a, cluster.listener_a) == before


async def test_a_worker_of_another_version_exits_with_the_services_message(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rendezvous_client, "PROTOCOL_VERSION", PROTOCOL_VERSION + 1)
    client = RendezvousClient(cluster.service.url, "job-a", TOKEN_A, retry_deadline_s=DEADLINE)
    started = time.monotonic()
    with pytest.raises(RendezvousClientError, match="426") as caught:
        await asyncio.to_thread(client.round_info)
    assert f"protocol {PROTOCOL_VERSION + 1}" in str(caught.value)
    assert f"speaks {PROTOCOL_VERSION}" in str(caught.value)
    assert time.monotonic() - started < 2, "not retried"


async def test_responses_carry_the_service_version(cluster: Cluster) -> None:
    async with cluster.session.get(cluster.service.url + "/healthz") as response:
        assert response.headers[PROTOCOL_HEADER] == str(PROTOCOL_VERSION)


# ---- TLS ---------------------------------------------------------------------------------


def connect_until_refused(port: int, count: int) -> int:
    """Open up to ``count`` connections to ``port`` one after another, without the service
    accepting any (the caller's event loop is blocked meanwhile); stop at the first that the
    kernel does not complete within 0.2 s (a dropped SYN is retried only after 1 s)."""
    opened: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket()
            opened.append(sock)
            sock.settimeout(0.2)
            try:
                sock.connect(("127.0.0.1", port))
            except OSError:
                break
        else:
            return count
        return len(opened) - 1
    finally:
        for sock in opened:
            sock.close()


async def test_a_burst_of_connections_waits_for_a_busy_service() -> None:
    """A notice wakes every worker of a job at once, while the service is busy answering:
    the kernel queues their connections rather than dropping them (aiohttp's default queue
    of 128 dropped the rest of a 1,024-worker burst)."""
    burst = 600
    if int(Path("/proc/sys/net/core/somaxconn").read_text()) < burst:
        pytest.skip("net.core.somaxconn caps every listen queue below the burst")
    service = RendezvousService()
    await service.start("127.0.0.1", 0)
    try:
        assert connect_until_refused(service.port, burst) == burst
    finally:
        await service.stop()


async def test_a_serving_process_collects_garbage_less_often() -> None:
    """Python's thresholds made full collections take a fifth of a 1,024-worker service's
    CPU; serving raises them (never lowers them)."""
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 100)
    service = RendezvousService()
    try:
        await service.start("127.0.0.1", 0)
        assert gc.get_threshold() == (GC_THRESHOLDS[0], GC_THRESHOLDS[1], 100)
    finally:
        await service.stop()
        gc.set_threshold(*before)


async def test_tls_service_and_verifying_client(tmp_path: Path) -> None:
    context, ca_pem = server_context(tmp_path)
    service = RendezvousService()
    job = service.add_job("job-a", KEY_A, RecordingListener())
    job.readmit([W0])
    await service.start("127.0.0.1", 0, ssl_context=context)
    try:
        assert service.url.startswith("https://127.0.0.1:")
        client = RendezvousClient(service.url, "job-a", TOKEN_A, ca_pem=ca_pem)
        info = await asyncio.to_thread(client.round_info)
        assert info.job == "job-a"
        await asyncio.to_thread(client.heartbeat, HeartbeatRequest(hostname="host-a", local_rank=0))

        _, other_ca = make_ca("someone else")
        other_pem = other_ca.public_bytes(serialization.Encoding.PEM).decode()
        stranger = RendezvousClient(service.url, "job-a", TOKEN_A, ca_pem=other_pem)
        started = time.monotonic()
        with pytest.raises(RendezvousClientError, match="not trusted"):
            await asyncio.to_thread(stranger.round_info)
        assert time.monotonic() - started < 5, "a certificate that fails is not retried"

        plain = RendezvousClient(
            service.url.replace("https", "http"), "job-a", TOKEN_A, retry_deadline_s=0.5
        )
        with pytest.raises(RendezvousClientError):
            await asyncio.to_thread(plain.round_info)
    finally:
        await service.stop()


def test_ca_from_the_worker_environment() -> None:
    environ = {
        ENV_RENDEZVOUS_URL: "https://rendezvous.example:8470",
        ENV_JOB: "ns.job",
        ENV_TOKEN: "t0ken-value",
        ENV_HOSTNAME: "pod-0",
        ENV_LOCAL_RANK: "0",
        ENV_RENDEZVOUS_CA: "-----BEGIN CERTIFICATE-----\nnot really\n",
    }
    config = WorkerConfig.from_env(environ)
    assert config is not None and config.rendezvous_ca == environ[ENV_RENDEZVOUS_CA]
    with pytest.raises(ValueError, match="CA certificate does not load"):
        RendezvousClient(config.rendezvous_url, config.job, config.token, ca_pem="garbage")


# ---- slow and malformed connections ------------------------------------------------------


def port_of(service: RendezvousService) -> int:
    return service.port


async def test_a_connection_that_dribbles_its_headers_is_closed(cluster: Cluster) -> None:
    def dribble() -> float:
        with socket.create_connection(("127.0.0.1", port_of(cluster.service)), timeout=8) as sock:
            started = time.monotonic()
            sock.sendall(b"POST /v1/jobs/job-a/rendezvous HTTP/1.1\r\nHost: x\r\n")
            try:
                while time.monotonic() - started < 8:
                    sock.sendall(b"X")
                    time.sleep(0.2)
            except OSError:
                return time.monotonic() - started  # the server closed it
            return time.monotonic() - started

    elapsed = await asyncio.wait_for(asyncio.to_thread(dribble), DEADLINE)
    assert 0.9 <= elapsed < 3.0, f"closed after {elapsed:.1f} s; the header timeout is 1 s"
    status, _ = await cluster.call("GET", "/v1/jobs/job-a/round")
    assert status == 200, "complete requests are still served"


def read_answer(sock: socket.socket) -> tuple[bytes, bytes]:
    """One HTTP answer from ``sock``: its head and its body (of its Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        assert chunk, f"closed before an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(4096)
        assert chunk, "closed in the body"
        body += chunk
    return head, body


ROUND_REQUEST = (
    b"GET /v1/jobs/job-a/round HTTP/1.1\r\nHost: x\r\n"
    + f"Authorization: Bearer {TOKEN_A}\r\n".encode()
    + f"{PROTOCOL_HEADER}: {PROTOCOL_VERSION}\r\n".encode()
)


async def test_a_kept_alive_connection_that_dribbles_its_next_headers_is_closed(
    cluster: Cluster,
) -> None:
    """A connection kept alive after an answer has the same bound for its next request's
    headers as a new one for its first (here 1 s): the keep-alive timeout."""

    def answered_then_dribble() -> tuple[bytes, float]:
        with socket.create_connection(("127.0.0.1", port_of(cluster.service)), timeout=8) as sock:
            sock.sendall(ROUND_REQUEST + b"\r\n")
            head, _ = read_answer(sock)
            started = time.monotonic()
            sock.sendall(ROUND_REQUEST)
            try:
                while time.monotonic() - started < 8:
                    sock.sendall(b"X-Slow: 1\r\n")
                    time.sleep(0.2)
            except OSError:
                return head, time.monotonic() - started  # the server closed it
            return head, time.monotonic() - started

    head, elapsed = await asyncio.wait_for(asyncio.to_thread(answered_then_dribble), DEADLINE)
    assert head.split(b" ")[1] == b"200" and b"connection: close" not in head.lower(), head
    assert 0.9 <= elapsed < 3.0, f"closed after {elapsed:.1f} s; the header timeout is 1 s"


async def test_a_refused_request_closes_its_connection_and_an_answered_one_keeps_it(
    cluster: Cluster,
) -> None:
    def two_then_refused() -> tuple[list[bytes], bytes]:
        with socket.create_connection(("127.0.0.1", port_of(cluster.service)), timeout=8) as sock:
            heads = []
            for request in (
                ROUND_REQUEST,
                ROUND_REQUEST,
                ROUND_REQUEST.replace(TOKEN_A.encode(), b"wrong"),
            ):
                sock.sendall(request + b"\r\n")
                heads.append(read_answer(sock)[0])
            return heads, sock.recv(100)

    heads, after = await asyncio.wait_for(asyncio.to_thread(two_then_refused), DEADLINE)
    assert [head.split(b" ")[1] for head in heads] == [b"200", b"200", b"403"]
    assert b"connection: close" in heads[2].lower() and after == b"", "closed after the 403"


async def test_half_a_request_line_is_closed_within_the_bound(cluster: Cluster) -> None:
    def half_line() -> tuple[bytes, float]:
        with socket.create_connection(("127.0.0.1", port_of(cluster.service)), timeout=8) as sock:
            started = time.monotonic()
            sock.sendall(b"GET /heal")
            return sock.recv(100), time.monotonic() - started

    data, elapsed = await asyncio.wait_for(asyncio.to_thread(half_line), DEADLINE)
    assert data == b"" and elapsed < 3.0


async def test_malformed_http_is_one_warning_line_without_the_token(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)

    def send(raw: bytes) -> bytes:
        with socket.create_connection(("127.0.0.1", port_of(cluster.service)), timeout=8) as sock:
            sock.sendall(raw)
            return sock.recv(4096)

    raw = (
        b"GET /v1/jobs/job-a/round HTTP/1.1\r\nHost: x\r\n"
        + f"Authorization: Bearer {TOKEN_A}\x01\r\n".encode()
        + b"Broken header line\r\n\r\n"
    )
    answer = await asyncio.wait_for(asyncio.to_thread(send, raw), DEADLINE)
    assert answer.split(b" ")[1] == b"400"
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert records, "the bad request is logged"
    for record in records:
        assert record.levelno == logging.WARNING and record.exc_info is None, record.getMessage()
        assert "\n" not in record.getMessage()
        assert TOKEN_A not in record.getMessage()
    assert any("bad HTTP request" in r.getMessage() for r in records)


async def test_a_client_gone_before_its_body_ended_is_a_400_without_a_traceback(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker process that exits with a heartbeat in flight: the service answers the
    broken request 400 (to nobody) and logs one line, no error with a traceback."""
    caplog.set_level(logging.INFO, logger="elasticjob.rendezvous.routes")

    def half_a_body() -> None:
        with socket.create_connection(("127.0.0.1", port_of(cluster.service)), timeout=8) as sock:
            sock.sendall(
                b"POST /v1/jobs/job-a/heartbeat HTTP/1.1\r\nHost: x\r\n"
                + f"Authorization: Bearer {TOKEN_A}\r\n".encode()
                + f"{PROTOCOL_HEADER}: {PROTOCOL_VERSION}\r\n".encode()
                + b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
                + b'{"hostname": '
            )

    await asyncio.wait_for(asyncio.to_thread(half_a_body), DEADLINE)
    deadline = time.monotonic() + DEADLINE
    while not any("heartbeat -> 400" in r.getMessage() for r in caplog.records):
        assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
        await asyncio.sleep(0.05)
    assert all(r.levelno < logging.WARNING and r.exc_info is None for r in caplog.records), [
        r.getMessage() for r in caplog.records
    ]


def heartbeat_head(token: str = TOKEN_A, job: str = "job-a") -> bytes:
    """A heartbeat's request line and headers, announcing a 100-byte body."""
    return (
        f"POST /v1/jobs/{job}/heartbeat HTTP/1.1\r\nHost: x\r\n".encode()
        + f"Authorization: Bearer {token}\r\n".encode()
        + f"{PROTOCOL_HEADER}: {PROTOCOL_VERSION}\r\n".encode()
        + b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    )


def held_body(port: int, wait_s: float) -> tuple[bytes, float]:
    """Send a heartbeat's headers and the start of its body, never the rest: the answer's
    status line and how long it took (b"" if none came within ``wait_s``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        started = time.monotonic()
        sock.sendall(heartbeat_head() + b'{"hostname": ')
        try:
            answer = sock.recv(200)
        except TimeoutError:
            answer = b""
        return answer.split(b"\r\n", 1)[0], time.monotonic() - started


async def test_a_body_that_never_ends_is_408_within_its_deadline_and_changes_nothing(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="elasticjob.rendezvous")
    before = snapshot(cluster.job_a, cluster.listener_a)
    line, elapsed = await asyncio.wait_for(
        asyncio.to_thread(held_body, port_of(cluster.service), 8.0), DEADLINE
    )
    assert line.split(b" ")[1:2] == [b"408"], line
    assert BODY_TIMEOUT_S <= elapsed < BODY_TIMEOUT_S + 2.0, elapsed
    assert snapshot(cluster.job_a, cluster.listener_a) == before
    assert cluster.job_a.bodies.held == 0
    assert all(r.exc_info is None and r.levelno < logging.WARNING for r in caplog.records)


async def test_a_job_holding_its_bound_of_bodies_is_refused_more_and_other_jobs_are_not() -> None:
    async with started_cluster(body_timeout=DEADLINE) as cluster:
        bound = cluster.job_a.limits.bodies
        port = port_of(cluster.service)
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(bound)]
        try:
            for sock in held:
                sock.sendall(heartbeat_head() + b'{"hostname": ')
            deadline = time.monotonic() + DEADLINE
            while cluster.job_a.bodies.held < bound:
                assert time.monotonic() < deadline, f"{cluster.job_a.bodies.held} bodies held"
                await asyncio.sleep(0.01)
            line, _ = await asyncio.wait_for(asyncio.to_thread(held_body, port, 5.0), DEADLINE)
            assert line.split(b" ")[1:2] == [b"429"], line
            status, _ = await cluster.call(
                "POST", "/v1/jobs/job-b/heartbeat", token=TOKEN_B, json=HEARTBEAT_W0
            )
            assert status == 204, "another job's bodies are its own"
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + DEADLINE
        while cluster.job_a.bodies.held:
            assert time.monotonic() < deadline, "a closed connection's body is let go"
            await asyncio.sleep(0.01)
        status, _ = await cluster.call("POST", "/v1/jobs/job-a/heartbeat", json=HEARTBEAT_W0)
        assert status == 204


async def test_an_encoded_newline_in_the_path_stays_on_one_log_line(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="elasticjob.rendezvous.routes")
    status, _ = await cluster.call("GET", "/v1/jobs/job-a%0AFORGED%20LINE/round")
    assert status == 403
    messages = [r.getMessage() for r in caplog.records if "FORGED" in r.getMessage()]
    assert messages and all("\n" not in m for m in messages), messages


async def test_the_token_appears_in_no_log_line_and_no_repr(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for token in (TOKEN_B, f"{TOKEN_A}x", f"{TOKEN_A} extra"):
        await cluster.call("GET", "/v1/jobs/job-a/round", token=token)
    await cluster.call("GET", "/v1/jobs/job-b/round", token=TOKEN_A)
    client = RendezvousClient(cluster.service.url, "job-a", TOKEN_A, retry_deadline_s=0.5)
    with pytest.raises(RendezvousClientError):
        await asyncio.to_thread(
            client.heartbeat, HeartbeatRequest(hostname="planted", local_rank=0)
        )
    config = WorkerConfig(
        rendezvous_url=cluster.service.url,
        job="job-a",
        token=TOKEN_A,
        hostname="host-a",
        local_rank=0,
        bind_address="127.0.0.1",
    )
    logged = "\n".join(r.getMessage() + (r.exc_text or "") for r in caplog.records)
    assert "403" in logged or caplog.records, "the refusals were logged"
    for text in (logged, repr(cluster.job_a), repr(client), repr(config)):
        assert TOKEN_A not in text and TOKEN_B not in text, text
