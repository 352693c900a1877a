"""The driver, with its fakes, when one process of a host that lives on fails: the plan of
``slot_loss.py`` carried out for a pod's report (``POST exits``, answered) and for a process
the local launcher saw exit. Restarted in place: the round fails, nothing is struck or
removed, and the slot's fresh process joins the next round as a newcomer beside its host's
survivors. Dropped: the host goes, as for any other failure."""

from __future__ import annotations

import logging

import pytest

from elasticjob.driver.worker_exits import ExitCause
from elasticjob.wire.messages import ExitReport, HeartbeatRequest, HeldShards, NoticeKind, WorkerId
from tests.support.driver_job import A0, A1, Job, settings

B0, B1 = WorkerId("b", 0), WorkerId("b", 1)


def beat(job: Job, worker: WorkerId, held: HeldShards) -> None:
    job.job.report_heartbeat(
        HeartbeatRequest(hostname=worker.hostname, local_rank=worker.local_rank, held_shards=held)
    )


def pod_saw(job: Job, worker: WorkerId, code: int) -> tuple[bool, str]:
    answer = job.job.report_exit(
        ExitReport(hostname=worker.hostname, local_rank=worker.local_rank, exit_code=code)
    )
    return answer.restart, answer.reason


async def test_a_pods_lost_slot_of_the_one_hsdp_replica_restarts_in_place(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One pod of two slots, HSDP with one replica, each rank keeping a copy of the other's
    shard (what their heartbeats say, after their first commit): its slot 1 fails. Dropping
    the pod would leave nobody; restarting the slot moves half a replica."""
    job = Job({"a": 2}, settings())
    await job.start_round_1(A0, A1)
    beat(job, A0, HeldShards(shards=2, own=0, copies=(1,), hsdp=True))
    beat(job, A1, HeldShards(shards=2, own=1, copies=(0,), hsdp=True))
    with caplog.at_level(logging.WARNING):
        restart, reason = pod_saw(job, A1, -9)
    assert restart and "its slot's restart moves 1/2 of a replica" in reason
    assert "worker a[1] restarts in its slot" in caplog.text
    assert (await job.notices()) == [(NoticeKind.ROUND_FAILED, ("a",))]
    assert pod_saw(job, A1, -9) == (False, ""), "its end was heard already"
    await job.ask(A0, 1, rolled_back=True)
    await job.step()
    assert job.launcher.started == [A0, A1, A1], "a fresh process for the slot"
    assert job.launcher.stopped == [] and not job.hosts.capacity().blacklisted
    await job.ask(A1)
    await job.step()
    assert job.driver.round == 2 and list(job.driver.slots) == [A0, A1]


async def test_a_pods_lost_slot_of_an_hsdp_job_with_two_replicas_drops_the_pod() -> None:
    """Two pods of two slots, HSDP: the other pod is a whole replica, so dropping the pod
    moves nothing; it is killed through the front end as before."""
    job = Job({"a": 2, "b": 2}, settings())
    await job.start_round_1(A0, A1, B0, B1)
    for worker in (A0, A1, B0, B1):
        beat(job, worker, HeldShards(shards=2, own=worker.local_rank, hsdp=True))
    assert pod_saw(job, B1, -9) == (False, "")
    await job.step()
    assert job.launcher.stopped == [B1], "killed (the fake launcher's kill is its stop)"


async def test_a_process_the_local_launcher_saw_exit_restarts_where_a_reshard_moves_more() -> None:
    """Two hosts of two slots, FSDP over all four with one copy each: without its host the
    two ranks left would reshard half of the state; its slot's restart moves a quarter."""
    job = Job({"a": 2, "b": 2}, settings())
    await job.start_round_1(A0, A1, B0, B1)
    held = {A0: (0, 2), A1: (1, 3), B0: (2, 0), B1: (3, 1)}
    for worker, (own, copy) in held.items():
        beat(job, worker, HeldShards(shards=4, own=own, copies=(copy,)))
    effects = job.driver.on_worker_exit(B1, 137, ExitCause.SLOT_ENDED)
    assert effects.restart and effects.fail_round and not effects.blacklist
    for worker in (A0, A1, B0):
        await job.ask(worker, 1, rolled_back=True)
    await job.step()
    assert job.launcher.started[-1] == B1 and not job.hosts.capacity().blacklisted
    await job.ask(B1)
    await job.step()
    assert job.driver.round == 2 and list(job.driver.slots) == [A0, A1, B0, B1]


async def test_a_host_whose_processes_all_end_is_dropped() -> None:
    """Both processes of a host end (the first restarts in place, its sibling living); the
    second has no sibling left: the host is struck and goes, the first's restart with it."""
    job = Job({"a": 2, "b": 2}, settings())
    await job.start_round_1(A0, A1, B0, B1)
    held = {A0: (0, 2), A1: (1, 3), B0: (2, 0), B1: (3, 1)}
    for worker, (own, copy) in held.items():
        beat(job, worker, HeldShards(shards=4, own=own, copies=(copy,)))
    assert job.driver.on_worker_exit(B1, 137, ExitCause.SLOT_ENDED).restart
    second = job.driver.on_worker_exit(B0, 137, ExitCause.SLOT_ENDED)
    assert second.blacklist and not second.restart
    for worker in (A0, A1):
        await job.ask(worker, 1, rolled_back=True)
    await job.step()
    assert job.driver.round == 2 and list(job.driver.slots) == [A0, A1]


async def test_a_slot_that_fails_before_its_first_round_runs_takes_its_pod_down() -> None:
    """No round runs yet (the first one forms): the report is answered as before, and the
    pod goes."""
    job = Job({"a": 2}, settings())
    await job.discover()
    await job.step()
    await job.ask(A0)
    assert pod_saw(job, A1, -9) == (False, "")
    await job.step()
    assert job.launcher.stopped == [A1], "killed (the fake launcher's kill is its stop)"
