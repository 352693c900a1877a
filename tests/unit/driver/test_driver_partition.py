"""The driver, step by step, with a member its peers cannot reach, or whose pod saw it end:
probe reports come with heartbeats, and a pod's reports of its slots' ends, through the real
in-memory rendezvous; the driver kills the member, the survivors are told and re-form without
its host (see ``test_driver.py`` for the fakes)."""

from __future__ import annotations

import logging

import pytest

from elasticjob.driver.liveness import REACH_GRACE_S
from elasticjob.driver.slot_assignment import assign_slots
from elasticjob.rendezvous.rendezvous_types import RequestRefused
from elasticjob.wire.messages import (
    ExitReport,
    HeartbeatRequest,
    NoticeKind,
    ProbedPeer,
    WorkerId,
)
from tests.support.driver_job import A0, B0, C0, Job, settings

HEARTBEAT_TIMEOUT_S = 5.0


def beat(job: Job, worker: WorkerId, round_number: int | None, *unreachable: WorkerId) -> None:
    """``worker`` beats, with a probe report of ``round_number`` naming ``unreachable``."""
    job.job.report_heartbeat(
        HeartbeatRequest(
            hostname=worker.hostname,
            local_rank=worker.local_rank,
            round=round_number,
            unreachable=tuple(
                ProbedPeer(hostname=w.hostname, local_rank=w.local_rank) for w in unreachable
            ),
        )
    )


async def test_a_member_its_peers_cannot_reach_is_killed_and_the_round_re_forms(
    caplog: pytest.LogCaptureFixture,
) -> None:
    job = Job({"a": 1, "b": 1, "c": 1}, settings(heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S))
    await job.start_round_1(A0, B0, C0)
    # b is cut off from a and c but still reaches the rendezvous: everyone keeps beating.
    beat(job, A0, 1, B0)
    beat(job, B0, 1, A0, C0)
    job.clock.now += 0.5
    await job.step()
    assert job.launcher.stopped == [], "one of b's two probers has reported so far"
    beat(job, C0, 1, B0)
    with caplog.at_level(logging.ERROR, logger="elasticjob.driver.workers"):
        await job.step()
    assert job.launcher.stopped == [B0], "killed (the fake launcher's kill is its stop)"
    assert "worker b[0] unreachable from its peers (reported by a[0], c[0]): killing it" in (
        caplog.text
    )
    beat(job, A0, 1, B0)
    await job.step()
    assert job.launcher.stopped == [B0], "killed once"
    # Its exit fails the round: the survivors are told at once and re-form without b.
    job.launcher.end(B0, -9)
    assert (await job.notices()) == [(NoticeKind.ROUND_FAILED, ("b",))]
    await job.ask(A0, 1)
    await job.ask(C0, 1)
    await job.step()
    assert job.driver.round == 2 and list(job.driver.slots) == [A0, C0]
    assert (await job.ask(C0, 1)).sync is True, "the next round re-syncs from rank 0"
    assert "b" in job.hosts.blacklist


@pytest.mark.parametrize(
    ("timeout_s", "reports"),
    [
        (None, [(A0, 1, [B0]), (C0, 1, [B0])]),
        (HEARTBEAT_TIMEOUT_S, [(A0, 0, [B0]), (C0, 1, [B0])]),
        (HEARTBEAT_TIMEOUT_S, [(A0, 1, [B0]), (C0, 1, [B0]), (C0, None, [])]),
    ],
    ids=["no-heartbeat-timeout", "older-round", "unblocked-since"],
)
async def test_reports_that_do_not_count(
    timeout_s: float | None, reports: list[tuple[WorkerId, int | None, list[WorkerId]]]
) -> None:
    """Without a heartbeat timeout nobody is killed; a report of an older round is dropped
    by the rendezvous; a beat without a report (the collective completed) clears the last."""
    job = Job({"a": 1, "b": 1, "c": 1}, settings(heartbeat_timeout_s=timeout_s))
    await job.start_round_1(A0, B0, C0)
    for worker, round_number, unreachable in reports:
        beat(job, worker, round_number, *unreachable)
    job.clock.now += 0.5
    await job.step()
    assert job.launcher.stopped == []


async def test_adopted_members_have_a_grace_to_find_the_restarted_driver() -> None:
    """A restarted driver adopts the running round: its members' silence counts only after
    the grace they have to find it; then a member that never beats is killed, one that
    beats is not."""
    job = Job({"a": 1, "b": 1}, settings(heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S))
    await job.discover()
    slots = assign_slots([("a", 1), ("b", 1)], min_np=1, max_np=None)
    job.driver.adopt(3, slots, notice_seq=0)
    job.clock.now += REACH_GRACE_S + HEARTBEAT_TIMEOUT_S - 1
    await job.step()
    assert job.launcher.stopped == [], "within the grace and the timeout"
    beat(job, A0, 3)
    job.clock.now += 2
    await job.step()
    assert job.launcher.stopped == [B0], "b never beat: killed; a beat: kept"


async def test_silence_does_not_count_while_the_workers_cannot_reach_the_driver() -> None:
    """The driver's pod is not ready (its Service routes nowhere): its workers' silence
    says nothing about them. Once it is ready again they have the grace to beat."""
    job = Job({"a": 1, "b": 1}, settings(heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S))
    await job.start_round_1(A0, B0)
    beat(job, A0, None)
    beat(job, B0, None)
    assert job.driver.reachability.update(False, job.clock.now)
    job.clock.now += 600
    await job.step()
    assert job.launcher.stopped == [], "unreachable: nobody is killed"
    assert job.driver.reachability.update(True, job.clock.now)
    assert not job.driver.reachability.update(True, job.clock.now), "no change"
    job.clock.now += REACH_GRACE_S + HEARTBEAT_TIMEOUT_S - 1
    beat(job, A0, None)
    await job.step()
    assert job.launcher.stopped == [], "within the grace and the timeout"
    job.clock.now += 2
    await job.step()
    assert job.launcher.stopped == [B0], "b never beat again: evicted; a beat: kept"


async def test_silence_does_not_count_across_a_late_event_loop() -> None:
    """An overloaded service answers beats late; its driver does not take the delay for
    silence (it would evict healthy workers and overload the service more)."""
    job = Job({"a": 1, "b": 1}, settings(heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S))
    await job.start_round_1(A0, B0)
    beat(job, A0, None)
    beat(job, B0, None)
    job.clock.now += HEARTBEAT_TIMEOUT_S + 1
    assert job.driver.reachability.loop_ran_late(HEARTBEAT_TIMEOUT_S, job.clock.now)
    await job.step()
    assert job.launcher.stopped == [], "the loop was late: nobody is killed"
    job.clock.now += HEARTBEAT_TIMEOUT_S - 1
    beat(job, A0, None)
    await job.step()
    assert job.launcher.stopped == [], "within the timeout counted from the lag"
    job.clock.now += 2
    await job.step()
    assert job.launcher.stopped == [B0], "b never beat after the lag: evicted; a beat: kept"


async def test_a_fresh_process_on_a_dead_members_slot_is_not_the_one_its_peers_reported() -> None:
    """A job of two at its min_np: b is SIGKILLed while a's collective waits on it, and a,
    waiting for the next round, keeps reporting b unreachable in round 1 (the round in force:
    the next cannot form without a second slot). b's cooldown ends and a fresh process starts
    on its slot: the report is about the dead one. It used to kill every fresh b as it
    started, the job never forming its next round (found by bench/convergence.py)."""
    job = Job({"a": 1, "b": 1}, settings(min_np=2, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S))
    await job.start_round_1(A0, B0)
    beat(job, A0, 1, B0)
    job.launcher.end(B0, -9)
    await job.ask(A0, 1)
    await job.step()
    assert job.driver.round == 1 and "b" in job.hosts.blacklist
    job.clock.now += 10.5  # b's cooldown
    await job.discover()
    beat(job, A0, 1, B0)
    await job.step()
    assert job.launcher.started == [A0, B0, B0], "a fresh b"
    beat(job, A0, 1, B0)
    await job.ask(B0)
    await job.step()
    assert job.launcher.stopped == [], "the fresh b is not killed for the dead one"
    await job.ask(A0, 1)
    await job.step()
    assert job.driver.round == 2 and list(job.driver.slots) == [A0, B0]


async def test_a_member_its_pod_saw_end_is_killed_at_once_and_the_round_re_forms(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A pod's slot supervisor reports that the process of one of its slots ended: the driver
    does not wait for its heartbeat to stop or its peers to miss it (no heartbeat timeout
    here at all), it kills the worker through its launcher, whose report of the end fails the
    round."""
    job = Job({"a": 1, "b": 1, "c": 1}, settings())
    await job.start_round_1(A0, B0, C0)
    with caplog.at_level(logging.WARNING):
        job.job.report_exit(ExitReport(hostname="b", local_rank=0, exit_code=-9))
        job.job.report_exit(ExitReport(hostname="b", local_rank=0, exit_code=-9))
        await job.step()
        await job.step()
    assert job.launcher.stopped == [B0], "killed once (the fake launcher's kill is its stop)"
    assert caplog.text.count("worker b[0] ended with -9 (its pod saw it)") == 1
    job.launcher.end(B0, 1)
    assert (await job.notices()) == [(NoticeKind.ROUND_FAILED, ("b",))]
    await job.ask(A0, 1)
    await job.ask(C0, 1)
    await job.step()
    assert job.driver.round == 2 and list(job.driver.slots) == [A0, C0]


async def test_a_pods_report_for_a_worker_it_does_not_hold_is_refused() -> None:
    job = Job({"a": 1}, settings())
    await job.start_round_1(A0)
    with pytest.raises(RequestRefused):
        job.job.report_exit(ExitReport(hostname="z", local_rank=0, exit_code=1))
    await job.step()
    assert job.launcher.stopped == [] and job.driver.round == 1
