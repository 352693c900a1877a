"""Tests of the in-memory rendezvous state of one job (no HTTP)."""

from __future__ import annotations

import asyncio

import pytest

from elasticjob.rendezvous.job_credentials import JobKey, Speaker
from elasticjob.rendezvous.jobs import InMemoryJobRendezvous
from elasticjob.rendezvous.notice_log import MAX_NOTICES
from elasticjob.rendezvous.rendezvous_types import RendezvousError
from elasticjob.wire.messages import (
    HeartbeatRequest,
    HeldShards,
    NoticeKind,
    ProgressRequest,
    RendezvousStatus,
    ResultRequest,
    ScriptExit,
    WorkerId,
    WorkerState,
)
from tests.support.rendezvous_jobs import (
    DEADLINE,
    W0,
    W1,
    W2,
    RecordingListener,
    request,
    slots_for,
)


class FailingListener(RecordingListener):
    def on_worker_ready(
        self,
        worker: WorkerId,
        after_round: int,
        *,
        rolled_back: bool,
        script_exit: ScriptExit | None = None,
        suspended: bool = False,
        held_shards: HeldShards | None = None,
    ) -> None:
        super().on_worker_ready(worker, after_round, rolled_back=rolled_back)
        raise RuntimeError("listener bug")


@pytest.fixture
def listener() -> RecordingListener:
    return RecordingListener()


@pytest.fixture
def job(listener: RecordingListener) -> InMemoryJobRendezvous:
    """A job whose driver launched W0, W1 and W2."""
    job = InMemoryJobRendezvous("job-a", "secret-a", listener)
    job.readmit([W0, W1, W2])
    return job


async def test_round_flow_assigns_members_with_rank0_store(
    job: InMemoryJobRendezvous, listener: RecordingListener
) -> None:
    first = await job.rendezvous(request(W0, port=29500))
    await job.rendezvous(request(W1, port=29600))
    assert first.status is RendezvousStatus.PENDING
    job.post_notice(NoticeKind.HOSTS_ADDED, ["host-b"])
    job.publish_round(1, slots_for([W1, W0]), sync=False)

    a = await job.rendezvous(request(W0, port=29500))
    b = await job.rendezvous(request(W1, port=29600))
    assert (a.status, b.status) == (RendezvousStatus.ASSIGNED, RendezvousStatus.ASSIGNED)
    assert a.slot is not None and a.slot.rank == 1
    assert b.slot is not None and b.slot.rank == 0
    for answer in (a, b):
        assert answer.round == 1
        assert (answer.store_address, answer.store_port) == ("addr-host-b", 29600)
        assert answer.notice_seq == 1
        assert answer.sync is False
    assert job.current_round == 1
    assert set(job.current_slots) == {W0, W1}
    assert {worker for worker, _ in listener.ready} == {W0, W1}
    assert job.round_info().hosts == ("host-b", "host-a")  # in rank order
    assert job.round_info().size == 2


def test_current_slots_is_a_read_only_view(job: InMemoryJobRendezvous) -> None:
    assert job.current_slots == {}
    with pytest.raises(TypeError):
        job.current_slots[W0] = slots_for([W0])[W0]  # type: ignore[index]


async def test_rolled_back_worker_is_reported_to_the_listener(
    job: InMemoryJobRendezvous, listener: RecordingListener
) -> None:
    await job.rendezvous(request(W0))
    await job.rendezvous(request(W1))
    job.publish_round(1, slots_for([W0, W1]), sync=True)
    await job.rendezvous(request(W1, after_round=1, rolled_back=True))
    await job.rendezvous(request(W0, after_round=1))
    assert listener.ready[-2:] == [(W1, 1), (W0, 1)]
    assert listener.rolled_back == [(W1, 1)]


async def test_retry_with_older_after_round_is_answered_at_once(
    job: InMemoryJobRendezvous,
) -> None:
    await job.rendezvous(request(W0))
    job.publish_round(1, slots_for([W0]), sync=True)
    job.publish_round(2, slots_for([W0]), sync=True)
    answer = await asyncio.wait_for(job.rendezvous(request(W0, after_round=1, wait=60)), DEADLINE)
    assert answer.status is RendezvousStatus.ASSIGNED and answer.round == 2


async def test_long_poll_wakes_on_publish(
    job: InMemoryJobRendezvous, listener: RecordingListener
) -> None:
    await job.rendezvous(request(W0))
    listener.ready_event.clear()
    waiter = asyncio.create_task(job.rendezvous(request(W1, wait=60)))
    await asyncio.wait_for(listener.ready_event.wait(), DEADLINE)
    assert not waiter.done()
    job.publish_round(1, slots_for([W0, W1]), sync=True)
    answer = await asyncio.wait_for(waiter, DEADLINE)
    assert answer.status is RendezvousStatus.ASSIGNED and answer.round == 1


async def test_non_member_keeps_waiting_through_a_round(
    job: InMemoryJobRendezvous, listener: RecordingListener
) -> None:
    await job.rendezvous(request(W0))
    waiter = asyncio.create_task(job.rendezvous(request(W1, wait=60)))
    await asyncio.wait_for(listener.ready_event.wait(), DEADLINE)
    job.publish_round(1, slots_for([W0]), sync=True)
    await asyncio.sleep(0)
    assert not waiter.done()
    job.publish_round(2, slots_for([W0, W1]), sync=True)
    assert (await asyncio.wait_for(waiter, DEADLINE)).round == 2


async def test_pending_after_wait_runs_out(job: InMemoryJobRendezvous) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    answer = await asyncio.wait_for(job.rendezvous(request(W0, wait=0.05)), DEADLINE)
    assert answer.status is RendezvousStatus.PENDING
    assert loop.time() - started >= 0.04


async def test_dismissed_worker_is_woken_and_not_registered_again(
    job: InMemoryJobRendezvous, listener: RecordingListener
) -> None:
    waiter = asyncio.create_task(job.rendezvous(request(W1, wait=60)))
    await asyncio.wait_for(listener.ready_event.wait(), DEADLINE)
    listener.dismissed.add(W1)  # the driver dismissed it, then tells the job
    job.dismiss([W1])
    assert (await asyncio.wait_for(waiter, DEADLINE)).status is RendezvousStatus.REMOVED
    await job.rendezvous(request(W0))
    job.publish_round(3, slots_for([W0]), sync=True)
    listener.ready.clear()
    later = await job.rendezvous(request(W1, after_round=3, wait=60))
    assert later.status is RendezvousStatus.REMOVED
    assert listener.ready == []


async def test_a_dismissed_worker_its_driver_takes_back_into_a_round_is_assigned(
    job: InMemoryJobRendezvous, listener: RecordingListener
) -> None:
    await job.rendezvous(request(W0))
    listener.dismissed.add(W1)
    job.dismiss([W1])
    listener.dismissed.discard(W1)  # its host came back: the driver makes it a member again
    job.publish_round(1, slots_for([W0, W1]), sync=True)
    answer = await job.rendezvous(request(W1))
    assert answer.status is RendezvousStatus.ASSIGNED


async def test_finish_wakes_everyone_and_answers_later_requests(
    job: InMemoryJobRendezvous, listener: RecordingListener
) -> None:
    waiter = asyncio.create_task(job.rendezvous(request(W0, wait=60)))
    poll = asyncio.create_task(job.notices(0, 60))
    await asyncio.wait_for(listener.ready_event.wait(), DEADLINE)
    job.finish("all done")
    answer = await asyncio.wait_for(waiter, DEADLINE)
    assert (answer.status, answer.message) == (RendezvousStatus.FINISHED, "all done")
    assert (await asyncio.wait_for(poll, DEADLINE)).notices == ()
    assert (await job.rendezvous(request(W1, wait=60))).status is RendezvousStatus.FINISHED
    assert job.finished


async def test_listener_told_once_per_worker_and_after_round(
    job: InMemoryJobRendezvous, listener: RecordingListener
) -> None:
    await job.rendezvous(request(W0))
    await job.rendezvous(request(W0))
    await job.rendezvous(request(W1))
    job.publish_round(2, slots_for([W0]), sync=True)
    await job.rendezvous(request(W0, after_round=2))
    await job.rendezvous(request(W0, after_round=2))
    assert listener.ready == [(W0, 0), (W1, 0), (W0, 2)]


async def test_failing_listener_does_not_fail_the_request() -> None:
    job = InMemoryJobRendezvous("job-a", "secret-a", FailingListener())
    job.readmit([W0])
    assert (await job.rendezvous(request(W0))).status is RendezvousStatus.PENDING
    job.publish_round(1, slots_for([W0]), sync=True)  # W0 registered: it can be rank 0
    assert (await job.rendezvous(request(W0))).status is RendezvousStatus.ASSIGNED


@pytest.mark.parametrize(
    ("round_number", "workers", "match"),
    [
        (1, [W1, W0], "rank-0 member host-b"),
        (0, [W0], "not newer"),
        (1, [], "every rank"),
    ],
)
async def test_publish_round_refuses(
    job: InMemoryJobRendezvous, round_number: int, workers: list[WorkerId], match: str
) -> None:
    await job.rendezvous(request(W0))
    with pytest.raises(RendezvousError, match=match):
        job.publish_round(round_number, slots_for(workers), sync=True)
    assert job.current_round == 0 and job.current_slots == {}


async def test_publish_round_refuses_gaps_duplicates_and_stale_rounds(
    job: InMemoryJobRendezvous,
) -> None:
    await job.rendezvous(request(W0))
    good = slots_for([W0, W1])
    gap = {W0: good[W0], W1: good[W1].model_copy(update={"rank": 2})}
    dup = {W0: good[W0], W1: good[W1].model_copy(update={"rank": 0})}
    wrong_size = {W0: good[W0], W1: good[W1].model_copy(update={"size": 3})}
    misnamed = {W0: good[W0], W2: good[W1]}
    for slots, match in [
        (gap, r"missing \[1\]"),
        (dup, "rank 0 given to"),
        (wrong_size, "size 3"),
        (misnamed, "names host-b"),
    ]:
        with pytest.raises(RendezvousError, match=match):
            job.publish_round(1, slots, sync=True)
    job.publish_round(3, good, sync=True)
    with pytest.raises(RendezvousError, match="not newer"):
        job.publish_round(3, good, sync=True)
    assert job.current_round == 3


async def test_notices_sequence_round_and_after_filter(job: InMemoryJobRendezvous) -> None:
    await job.rendezvous(request(W0))
    first = job.post_notice(NoticeKind.HOSTS_ADDED, ["host-b"])
    job.publish_round(1, slots_for([W0]), sync=True)
    second = job.post_notice(NoticeKind.ROUND_FAILED)
    assert (first.seq, first.round, second.seq, second.round) == (1, 0, 2, 1)
    everything = await job.notices(0, 0)
    assert [n.seq for n in everything.notices] == [1, 2]
    assert everything.latest_seq == 2
    newer = await job.notices(1, 0)
    assert newer.notices == (second,)
    assert (await job.notices(2, 0)).notices == ()


async def test_notices_long_poll_wakes_on_post(job: InMemoryJobRendezvous) -> None:
    job.post_notice(NoticeKind.HOSTS_ADDED)
    poll = asyncio.create_task(job.notices(1, 60))
    await asyncio.sleep(0)
    assert not poll.done()
    posted = job.post_notice(NoticeKind.HOSTS_REMOVED, ["host-b"])
    answer = await asyncio.wait_for(poll, DEADLINE)
    assert answer.notices == (posted,) and answer.latest_seq == 2


async def test_notices_wait_runs_out_empty(job: InMemoryJobRendezvous) -> None:
    answer = await asyncio.wait_for(job.notices(0, 0.05), DEADLINE)
    assert answer.notices == () and answer.latest_seq == 0


async def test_notices_keep_only_the_last_thousand(job: InMemoryJobRendezvous) -> None:
    for _ in range(MAX_NOTICES + 5):
        job.post_notice(NoticeKind.HOSTS_ADDED)
    kept = await job.notices(0, 0)
    assert len(kept.notices) == MAX_NOTICES
    assert kept.notices[0].seq == 6 and kept.notices[-1].seq == MAX_NOTICES + 5
    assert kept.latest_seq == MAX_NOTICES + 5
    assert [n.seq for n in (await job.notices(MAX_NOTICES + 3, 0)).notices] == [1004, 1005]


def test_post_notice_refuses_bad_host(job: InMemoryJobRendezvous) -> None:
    with pytest.raises(RendezvousError, match="invalid notice"):
        job.post_notice(NoticeKind.HOSTS_ADDED, ["not a host"])


async def test_results_progress_and_round_info(
    job: InMemoryJobRendezvous, listener: RecordingListener
) -> None:
    assert job.round_info().model_dump() == {
        "job": "job-a",
        "round": 0,
        "size": 0,
        "hosts": (),
        "latest_notice_seq": 0,
        "progress": None,
    }
    await job.rendezvous(request(W1))
    job.publish_round(1, slots_for([W1, W0, W2]), sync=True)
    job.post_notice(NoticeKind.ROUND_FAILED)
    result = ResultRequest(
        hostname="host-a",
        local_rank=1,
        state=WorkerState.FAILURE,
        script_exit=ScriptExit(exit_code=1),
    )
    progress = ProgressRequest(round=1, epoch=2, step=30, samples_per_second=12.5)
    job.report_result(result)
    job.report_progress(progress)
    assert listener.results == [result] and listener.progress == [progress]
    info = job.round_info()
    assert (info.round, info.size, info.hosts) == (1, 3, ("host-b", "host-a"))
    assert (info.latest_notice_seq, info.progress) == (1, progress)


def test_heartbeats_are_passed_to_the_listener(
    job: InMemoryJobRendezvous, listener: RecordingListener
) -> None:
    job.report_heartbeat(HeartbeatRequest(hostname="host-b", local_rank=0))
    job.report_heartbeat(HeartbeatRequest(hostname="host-a", local_rank=1))
    assert listener.heartbeats == [W1, W2]
    assert listener.ready == [], "a heartbeat is not a registration"


async def test_close_waits_answers_pending_long_polls(
    job: InMemoryJobRendezvous, listener: RecordingListener
) -> None:
    waiter = asyncio.create_task(job.rendezvous(request(W0, wait=60)))
    poll = asyncio.create_task(job.notices(0, 60))
    await asyncio.wait_for(listener.ready_event.wait(), DEADLINE)
    job.close_waits()
    assert (await asyncio.wait_for(waiter, DEADLINE)).status is RendezvousStatus.PENDING
    assert (await asyncio.wait_for(poll, DEADLINE)).notices == ()
    later = await asyncio.wait_for(job.rendezvous(request(W1, wait=60)), DEADLINE)
    assert later.status is RendezvousStatus.PENDING


def test_credentials_and_construction_errors(listener: RecordingListener) -> None:
    job = InMemoryJobRendezvous("ns.job-1", "key", listener)
    assert job.key.speaker(JobKey("key").worker_credential("h0")) == Speaker("h0")
    assert job.key.speaker("key") is None, "the key itself is no credential"
    for name in ["", "Upper", "-lead", "trail-", "a b"]:
        with pytest.raises(ValueError, match="invalid job name"):
            InMemoryJobRendezvous(name, "key", listener)
    for key in ["", "has space", "tök", "tab\t"]:
        with pytest.raises(ValueError, match="key"):
            InMemoryJobRendezvous("job", key, listener)


async def test_a_planned_round_is_answered_until_a_round_is_published(
    job: InMemoryJobRendezvous,
) -> None:
    assert (job.planned_round().round, job.planned_round().slots) == (0, ())
    slots = slots_for([W0, W1])
    job.plan_next(1, slots)
    planned = job.planned_round()
    assert planned.round == 1
    assert planned.slots == (slots[W0], slots[W1])
    await job.rendezvous(request(W0))
    job.publish_round(1, slots, sync=True)
    assert (job.planned_round().round, job.planned_round().slots) == (0, ())
