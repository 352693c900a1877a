"""What a job refuses: workers its driver did not launch, rounds not published yet, a changed
store endpoint, repeated results, long-polls beyond its bound. A refusal changes nothing."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable

import pytest

from elasticjob.rendezvous.jobs import InMemoryJobRendezvous
from elasticjob.rendezvous.limits import ANNOUNCED_ROUNDS_PER_WORKER, JobLimits
from elasticjob.rendezvous.rendezvous_types import Refusal, RequestRefused
from elasticjob.wire.messages import (
    HeartbeatRequest,
    ProgressRequest,
    RendezvousStatus,
    ResultRequest,
    ScriptExit,
    WorkerId,
    WorkerState,
)
from tests.support.rendezvous_jobs import DEADLINE, W0, W1, RecordingListener, request, slots_for

STRANGER = WorkerId("planted", 0)


def frozen_copy(job: InMemoryJobRendezvous) -> dict[str, object]:
    return copy.deepcopy(job._workers.__dict__)


@pytest.fixture
def listener() -> RecordingListener:
    return RecordingListener()


@pytest.fixture
def job(listener: RecordingListener) -> InMemoryJobRendezvous:
    job = InMemoryJobRendezvous("job-a", "secret-a", listener)
    job.readmit([W0, W1])
    return job


async def refused(
    job: InMemoryJobRendezvous, listener: RecordingListener, call: Callable[[], object]
) -> Refusal:
    """Make the call (awaiting what it returns, if anything); it must be refused and change
    nothing of the job."""
    before = (frozen_copy(job), job.round_info(), list(listener.ready), list(listener.results))
    with pytest.raises(RequestRefused) as caught:
        result = call()
        if asyncio.iscoroutine(result):
            await result
    after = (frozen_copy(job), job.round_info(), list(listener.ready), list(listener.results))
    assert after == before, "a refused request changed the job"
    return caught.value.refusal


@pytest.mark.parametrize(
    ("stage", "expected"),
    [
        ("before its first round", Refusal.NOT_ADMITTED_YET),
        ("with an adopted round only", Refusal.NOT_ADMITTED_YET),
        ("once it published a round", Refusal.UNKNOWN_WORKER),
    ],
)
async def test_unknown_worker_is_refused_everywhere(
    listener: RecordingListener, stage: str, expected: Refusal
) -> None:
    job = InMemoryJobRendezvous("job-a", "secret-a", listener)
    job.readmit([W0])
    if stage == "with an adopted round only":
        job.adopt(3, slots_for([W0]), notice_seq=0)
    elif stage == "once it published a round":
        await job.rendezvous(request(W0))
        job.publish_round(1, slots_for([W0]), sync=True)
    result = ResultRequest(hostname="planted", local_rank=0, state=WorkerState.SUCCESS)
    calls = [
        lambda: job.report_result(result),
        lambda: job.report_heartbeat(HeartbeatRequest(hostname="planted", local_rank=0)),
    ]
    for call in calls:
        assert await refused(job, listener, call) is expected
    assert listener.heartbeats == []
    # Asking for a round is refused retryably at every stage: a pod may ask before the
    # driver has planned it (the worker retries; nothing of it is kept meanwhile).
    asking = lambda: job.rendezvous(request(STRANGER, wait=60))  # noqa: E731
    assert await refused(job, listener, asking) is Refusal.NOT_ADMITTED_YET


async def test_members_of_a_published_or_adopted_round_are_admitted(
    listener: RecordingListener,
) -> None:
    adopted = InMemoryJobRendezvous("job-a", "secret-a", listener)
    adopted.adopt(5, slots_for([W0, W1]), notice_seq=3)
    answer = await adopted.rendezvous(request(W1, after_round=5))
    assert answer.status is RendezvousStatus.PENDING
    assert listener.ready == [(W1, 5)]


async def test_after_round_beyond_the_newest_published_is_refused(
    job: InMemoryJobRendezvous, listener: RecordingListener
) -> None:
    refusal = await refused(job, listener, lambda: job.rendezvous(request(W0, after_round=1)))
    assert refusal is Refusal.FUTURE_ROUND
    await job.rendezvous(request(W0))
    job.publish_round(2, slots_for([W0]), sync=True)
    assert (await job.rendezvous(request(W0, after_round=2))).status is RendezvousStatus.PENDING
    refusal = await refused(job, listener, lambda: job.rendezvous(request(W0, after_round=3)))
    assert refusal is Refusal.FUTURE_ROUND
    progress = ProgressRequest(round=3, epoch=0, step=0)
    assert await refused(job, listener, lambda: job.report_progress(progress)) is (
        Refusal.FUTURE_ROUND
    )


async def test_after_an_adoption_the_adopted_round_is_the_newest(
    listener: RecordingListener,
) -> None:
    job = InMemoryJobRendezvous("job-a", "secret-a", listener)
    job.adopt(7, slots_for([W0]), notice_seq=0)
    assert (await job.rendezvous(request(W0, after_round=7))).status is RendezvousStatus.PENDING
    refusal = await refused(job, listener, lambda: job.rendezvous(request(W0, after_round=8)))
    assert refusal is Refusal.FUTURE_ROUND


async def test_store_endpoint_is_bound_by_the_first_registration_of_a_round(
    job: InMemoryJobRendezvous, listener: RecordingListener
) -> None:
    await job.rendezvous(request(W0, port=29500))
    await job.rendezvous(request(W0, port=29500))  # a retry with the same endpoint is fine
    refusal = await refused(job, listener, lambda: job.rendezvous(request(W0, port=31337)))
    assert refusal is Refusal.ENDPOINT_CHANGED
    job.publish_round(1, slots_for([W0]), sync=True)
    answer = await job.rendezvous(request(W0, port=29500))
    assert answer.store_port == 29500, "the bound endpoint is what rank 0 publishes"
    # the next round may bind another endpoint; a new process may too
    await job.rendezvous(request(W0, after_round=1, port=29600))
    job.readmit([W0])
    await job.rendezvous(request(W0, after_round=1, port=29700))


async def test_a_second_result_of_a_process_is_refused(
    job: InMemoryJobRendezvous, listener: RecordingListener
) -> None:
    failure = ScriptExit(exit_code=1)
    result = ResultRequest(
        hostname="host-a", local_rank=0, state=WorkerState.FAILURE, script_exit=failure
    )
    job.report_result(result)
    refusal = await refused(job, listener, lambda: job.report_result(result))
    assert refusal is Refusal.RESULT_REPEATED
    job.readmit([W0])  # a new process reports its own
    job.report_result(result)
    assert len(listener.results) == 2


async def test_long_polls_beyond_the_bound_are_refused(listener: RecordingListener) -> None:
    limits = JobLimits.for_workers(1)
    job = InMemoryJobRendezvous("job-a", "secret-a", listener, limits=limits)
    job.readmit([W0])
    polls = [asyncio.create_task(job.notices(0, 60)) for _ in range(limits.long_polls)]
    await asyncio.sleep(0)
    assert job.long_polls == limits.long_polls
    refusal = await refused(job, listener, lambda: job.notices(0, 60))
    assert refusal is Refusal.TOO_MANY_WAITS
    refusal = await refused(job, listener, lambda: job.rendezvous(request(W0, wait=60)))
    assert refusal is Refusal.TOO_MANY_WAITS
    assert (await job.notices(0, 0)).notices == (), "a request that does not wait is served"
    job.finish("done")
    await asyncio.wait_for(asyncio.gather(*polls), DEADLINE)
    assert job.long_polls == 0


async def test_announced_rounds_per_worker_are_bounded(
    job: InMemoryJobRendezvous, listener: RecordingListener
) -> None:
    await job.rendezvous(request(W0))
    for round_number in range(1, 3 * ANNOUNCED_ROUNDS_PER_WORKER):
        job.publish_round(round_number, slots_for([W0]), sync=True)
        await job.rendezvous(request(W0, after_round=round_number))
    assert len(job._workers.entry(W0).announced) == ANNOUNCED_ROUNDS_PER_WORKER
    assert len(listener.ready) == 3 * ANNOUNCED_ROUNDS_PER_WORKER
