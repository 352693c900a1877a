"""The restart window over real HTTP: a rendezvous service that expects jobs back answers 503
with ``Retry-After`` for them until they are served, and the workers' client waits and
retries (bounded) instead of giving up on the 403 it would otherwise get."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from elasticjob.rendezvous.job_credentials import JobKey
from elasticjob.rendezvous.routes import RETRY_AFTER_S
from elasticjob.rendezvous.server import RendezvousService
from elasticjob.wire.messages import (
    RendezvousRequest,
    RendezvousStatus,
    RoundInfo,
    WorkerId,
)
from elasticjob.wire.protocol import PROTOCOL_HEADER, PROTOCOL_VERSION
from elasticjob.worker_runtime.link.rendezvous_client import RendezvousClient, RendezvousClientError
from tests.support.clock import FakeClock
from tests.support.rendezvous_jobs import RecordingListener

DEADLINE = 10.0
KEY = "key-of-the-job"
TOKEN = JobKey(KEY).worker_credential("pod-b")
"""The credential of the jobs' pod ``pod-b`` (it reads their rounds and speaks for it)."""


@pytest.fixture
async def service() -> AsyncIterator[RendezvousService]:
    service = RendezvousService(clock=FakeClock(100.0))
    await service.start("127.0.0.1", 0)
    try:
        yield service
    finally:
        await service.stop()


async def answer(
    service: RendezvousService, job: str, token: str = TOKEN
) -> tuple[int, str | None, bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"{service.url}/v1/jobs/{job}/round",
            headers={
                "Authorization": f"Bearer {token}",
                PROTOCOL_HEADER: str(PROTOCOL_VERSION),
            },
        ) as response,
    ):
        return response.status, response.headers.get("Retry-After"), await response.read()


async def get_round(service: RendezvousService, job: str) -> tuple[int, str | None]:
    status, retry_after, _ = await answer(service, job)
    return status, retry_after


async def test_a_job_expected_back_gets_503_with_retry_after_until_it_is_served(
    service: RendezvousService,
) -> None:
    assert await get_round(service, "ns.a") == (403, None)
    service.expect_jobs(["ns.a", "ns.b"], within_s=60)
    assert await get_round(service, "ns.a") == (503, str(RETRY_AFTER_S))
    assert await get_round(service, "ns.other") == (503, str(RETRY_AFTER_S))
    service.add_job("ns.a", KEY, RecordingListener())
    assert (await get_round(service, "ns.a"))[0] == 200
    assert (await get_round(service, "ns.b"))[0] == 503, "ns.b is not back yet"
    service.add_job("ns.b", KEY, RecordingListener())
    assert (await get_round(service, "ns.other"))[0] == 403, "every expected job is back"


async def test_while_jobs_are_taken_back_a_wrong_token_is_answered_as_an_unknown_job(
    service: RendezvousService,
) -> None:
    """Which jobs are served already does not leak: a served job asked with another token
    gets the very answer of a job that is not served (yet)."""
    service.add_job("ns.a", KEY, RecordingListener())
    service.expect_jobs(["ns.a", "ns.b"], within_s=60)
    served = await answer(service, "ns.a", token="a-guess")
    unknown = await answer(service, "ns.c", token="a-guess")
    assert served[:2] == unknown[:2] == (503, str(RETRY_AFTER_S))
    assert served[2] == unknown[2].replace(b"ns.c", b"ns.a")
    assert (await get_round(service, "ns.a"))[0] == 200, "its own token is served"


async def test_the_window_closes_after_its_bound() -> None:
    clock = FakeClock(100.0)
    bounded = RendezvousService(clock=clock)
    await bounded.start("127.0.0.1", 0)
    try:
        bounded.expect_jobs(["ns.gone"], within_s=30)
        assert (await get_round(bounded, "ns.gone"))[0] == 503
        clock.now += 30
        assert (await get_round(bounded, "ns.gone"))[0] == 403
    finally:
        await bounded.stop()


async def test_the_client_waits_for_its_job_to_come_back(
    service: RendezvousService, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="elasticjob.worker_runtime.link.rendezvous_client")
    service.expect_jobs(["ns.late"], within_s=60)
    client = RendezvousClient(service.url, "ns.late", TOKEN, retry_deadline_s=DEADLINE)
    started = time.monotonic()
    answer = asyncio.create_task(asyncio.to_thread(client.round_info))
    await asyncio.sleep(2.5 * RETRY_AFTER_S)  # the job comes back after a while
    service.add_job("ns.late", KEY, RecordingListener())
    info = await asyncio.wait_for(answer, DEADLINE)
    assert isinstance(info, RoundInfo)
    retries = [r for r in caplog.records if "answered 503" in r.getMessage()]
    # Retry-After is honoured: one retry per second, not the 50 ms backoff of a connection error.
    assert 2 <= len(retries) <= 4, [r.getMessage() for r in retries]
    assert all("retrying in 1.0 s" in r.getMessage() for r in retries)
    assert time.monotonic() - started >= 2.5 * RETRY_AFTER_S


async def test_the_client_gives_up_when_the_window_outlasts_its_deadline(
    service: RendezvousService,
) -> None:
    service.expect_jobs(["ns.never"], within_s=60)
    client = RendezvousClient(service.url, "ns.never", TOKEN, retry_deadline_s=1.5)
    with pytest.raises(RendezvousClientError, match="503"):
        await asyncio.wait_for(asyncio.to_thread(client.round_info), DEADLINE)


async def test_a_worker_asking_before_it_is_admitted_waits_as_long_as_it_waits_for_a_round(
    service: RendezvousService,
) -> None:
    """A pod can start and ask for its round before the driver plans it (admits it): the
    service refuses retryably, keeping nothing, and the worker keeps asking for as long as it
    is willing to wait for a round, well past the client's ordinary retry deadline."""
    job = service.add_job("ns.job", KEY, RecordingListener())
    early = WorkerId("pod-b", 0)
    client = RendezvousClient(service.url, "ns.job", TOKEN, retry_deadline_s=1.0)
    request = RendezvousRequest(
        hostname=early.hostname, local_rank=0, address="127.0.0.1", store_port=1, wait_seconds=0
    )
    with pytest.raises(RendezvousClientError, match="503"):
        await asyncio.wait_for(asyncio.to_thread(client.rendezvous, request), DEADLINE)
    asking = asyncio.create_task(
        asyncio.to_thread(client.rendezvous, request, retry_for_s=DEADLINE)
    )
    await asyncio.sleep(2.5 * RETRY_AFTER_S)  # longer than the client's ordinary deadline
    job.readmit([early])  # the driver plans it
    answer = await asyncio.wait_for(asking, DEADLINE)
    assert answer.status is RendezvousStatus.PENDING


# --- a replica that stands by, and a job handed over to another replica ---------------------


async def get_notices(service: RendezvousService, job: str, wait_s: float) -> int:
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"{service.url}/v1/jobs/{job}/notices?after=0&wait={wait_s}",
            headers={
                "Authorization": f"Bearer {TOKEN}",
                PROTOCOL_HEADER: str(PROTOCOL_VERSION),
            },
        ) as response,
    ):
        return response.status


async def test_a_standby_answers_every_job_503_with_retry_after(
    service: RendezvousService,
) -> None:
    service.stand_by()
    assert await get_round(service, "ns.any") == (503, str(RETRY_AFTER_S))
    service.lead([], within_s=60)
    assert await get_round(service, "ns.any") == (403, None), "a leader knows its jobs"


async def test_a_released_job_answers_its_long_polls_now_and_its_workers_retry_elsewhere(
    service: RendezvousService,
) -> None:
    service.add_job("ns.moving", KEY, RecordingListener())
    waiting = asyncio.create_task(get_notices(service, "ns.moving", wait_s=30))
    await asyncio.sleep(0.2)  # the long-poll is waiting at the service
    assert not waiting.done()
    service.stand_by()
    service.release_job("ns.moving")
    assert await asyncio.wait_for(waiting, DEADLINE) == 200, "answered as if its wait ran out"
    assert await get_round(service, "ns.moving") == (503, str(RETRY_AFTER_S))
    service.lead(["ns.moving"], within_s=60)
    service.add_job("ns.moving", KEY, RecordingListener())
    assert (await get_round(service, "ns.moving"))[0] == 200, "served again once it leads"
