"""The rendezvous service over real HTTP as the tests reach it: a started service with two
jobs and an HTTP client that sends what a worker sends."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any, Final

import aiohttp

from elasticjob.rendezvous.job_credentials import JobKey
from elasticjob.rendezvous.jobs import InMemoryJobRendezvous
from elasticjob.rendezvous.request_bodies import BODY_TIMEOUT_S
from elasticjob.rendezvous.server import RendezvousService
from elasticjob.rendezvous.transport import HEADER_TIMEOUT_S
from elasticjob.wire.messages import RendezvousResponse, WorkerId
from elasticjob.wire.protocol import PROTOCOL_HEADER, PROTOCOL_VERSION
from tests.support.rendezvous_jobs import W0, W1, RecordingListener

KEY_A = "key-of-job-a"
KEY_B = "key-of-job-b"
"""The jobs' keys (no credential: the service derives each credential from them)."""
TOKEN_A = JobKey(KEY_A).worker_credential(W0.hostname)
TOKEN_B = JobKey(KEY_B).worker_credential(W0.hostname)
"""A credential of each job: its worker ``W0``'s (it reads the job and speaks for ``W0``)."""
_SENDER: Final = "the sender's credential"
"""The credential of the worker a request's body names (else ``W0``'s, rank 0 where a test
forms a round)."""


def credential(hostname: str, job: str = "job-a") -> str:
    """The credential of the worker(s) on ``hostname`` of ``job`` (job-a or job-b)."""
    return JobKey(KEY_A if job == "job-a" else KEY_B).worker_credential(hostname)


def reader_token(job: str = "job-a") -> str:
    """The reader token of ``job`` (job-a or job-b)."""
    return JobKey(KEY_A if job == "job-a" else KEY_B).reader_token()


@contextlib.asynccontextmanager
async def started_cluster(
    *,
    header_timeout: float = HEADER_TIMEOUT_S,
    body_timeout: float = BODY_TIMEOUT_S,
    client_timeout_s: float = 90.0,
) -> AsyncIterator[Cluster]:
    """A :class:`Cluster` on a service started on loopback (with ``header_timeout`` and
    ``body_timeout``), stopped afterwards; the client gives up on a request after
    ``client_timeout_s``."""
    service = RendezvousService(header_timeout=header_timeout, body_timeout=body_timeout)
    await service.start("127.0.0.1", 0)
    try:
        timeout = aiohttp.ClientTimeout(total=client_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            yield Cluster(service, session)
    finally:
        await service.stop()


class Cluster:
    """A started service with jobs ``job-a`` and ``job-b``, and a client session."""

    def __init__(self, service: RendezvousService, session: aiohttp.ClientSession) -> None:
        self.service = service
        self.session = session
        self.listener_a = RecordingListener()
        self.listener_b = RecordingListener()
        self.job_a = service.add_job("job-a", KEY_A, self.listener_a)
        self.job_b = service.add_job("job-b", KEY_B, self.listener_b)
        for job in (self.job_a, self.job_b):
            job.readmit([W0, W1])  # as their drivers do before launching them

    async def call(
        self,
        method: str,
        path: str,
        *,
        token: str | None = _SENDER,
        json: object = None,
        data: bytes | AsyncIterator[bytes] | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """Send a request as a worker of this release does (with its protocol version and,
        unless ``token`` says otherwise, the credential of the worker its body names, else
        ``W0``'s); returns the status and the decoded JSON body (None if empty)."""
        all_headers = {PROTOCOL_HEADER: str(PROTOCOL_VERSION)} | dict(headers or {})
        if token == _SENDER:
            job = "job-b" if path.startswith("/v1/jobs/job-b/") else "job-a"
            sender = json.get("hostname", W0.hostname) if isinstance(json, dict) else W0.hostname
            token = credential(str(sender), job)
        if token is not None:
            all_headers["Authorization"] = f"Bearer {token}"
        async with self.session.request(
            method, self.service.url + path, json=json, data=data, headers=all_headers
        ) as response:
            body = await response.read()
            return response.status, (await response.json() if body else None)

    async def rendezvous(
        self, worker: WorkerId, *, after_round: int = 0, wait: float = 0.0, job: str = "job-a"
    ) -> RendezvousResponse:
        status, body = await self.call(
            "POST",
            f"/v1/jobs/{job}/rendezvous",
            json=rendezvous_body(worker, after_round=after_round, wait=wait),
        )
        assert status == 200, body
        return RendezvousResponse.model_validate(body)


def rendezvous_body(worker: WorkerId, *, after_round: int = 0, wait: float = 0.0) -> dict[str, Any]:
    return {
        "hostname": worker.hostname,
        "local_rank": worker.local_rank,
        "address": f"addr-{worker.hostname}",
        "store_port": 29500 + len(worker.hostname),
        "probe_port": 30500 + len(worker.hostname),
        "after_round": after_round,
        "wait_seconds": wait,
    }


def snapshot(job: InMemoryJobRendezvous, listener: RecordingListener) -> object:
    """Everything observable about a job's state."""
    return (
        job.round_info(),
        job.current_slots,
        job.finished,
        list(listener.ready),
        list(listener.results),
        list(listener.exits),
        list(listener.progress),
        list(listener.heartbeats),
        list(listener.incompatible),
    )
