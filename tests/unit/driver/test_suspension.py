"""Suspending a job: the pure decision (a row per branch), and the driver carrying it out
against the real in-memory rendezvous (workers played by requests, a fake clock)."""

from __future__ import annotations

import pytest

from elasticjob.driver.driver_types import DriverPhase
from elasticjob.driver.suspension import (
    SuspendDecision,
    SuspendMove,
    SuspendProgress,
    decide_suspension,
)
from elasticjob.wire.messages import NoticeKind, RendezvousStatus
from tests.support.driver_job import A0, B0, C0, Job, settings

TIMEOUT_S = 60.0
ASKED = SuspendProgress(requested_at=100.0)
TOLD = SuspendProgress(requested_at=100.0, notified_round=3)


R = DriverPhase.RUNNING


@pytest.mark.parametrize(
    ("progress", "phase", "recovering", "stopped", "saved", "unsaved", "now", "move", "clean"),
    [
        pytest.param(ASKED, DriverPhase.STARTING, False, 0, 0, 0, 100.0, SuspendMove.END, True,
                     id="no-round-yet-ends-at-once"),
        pytest.param(ASKED, DriverPhase.FORMING, False, 0, 0, 0, 130.0, SuspendMove.WAIT, True,
                     id="a-round-forming-is-let-form"),
        pytest.param(ASKED, DriverPhase.FORMING, False, 0, 0, 0, 160.0, SuspendMove.END, False,
                     id="a-round-that-does-not-form-in-time-ends-it"),
        pytest.param(ASKED, R, True, 1, 0, 1, 130.0, SuspendMove.WAIT, True,
                     id="a-recovery-is-let-finish"),
        pytest.param(ASKED, R, True, 1, 0, 1, 160.0, SuspendMove.END, False,
                     id="a-recovery-that-does-not-finish-in-time-ends-it"),
        pytest.param(ASKED, R, False, 0, 0, 0, 100.0, SuspendMove.NOTIFY, True,
                     id="a-running-round-is-told"),
        pytest.param(SuspendProgress(100.0, notified_round=2), R, False, 3, 0, 3, 101.0,
                     SuspendMove.NOTIFY, True, id="a-newer-round-is-told-too"),
        pytest.param(TOLD, R, False, 1, 1, 0, 130.0, SuspendMove.WAIT, True,
                     id="members-on-their-way"),
        pytest.param(TOLD, R, True, 1, 0, 0, 130.0, SuspendMove.WAIT, True,
                     id="a-failure-after-the-notice-waits-for-the-survivors"),
        pytest.param(TOLD, R, False, 3, 3, 0, 130.0, SuspendMove.END, True,
                     id="every-member-saved-its-state"),
        pytest.param(TOLD, R, False, 3, 2, 0, 130.0, SuspendMove.END, True,
                     id="one-member-gone-the-others-saved"),
        pytest.param(TOLD, R, False, 3, 1, 2, 130.0, SuspendMove.REFORM, True,
                     id="members-stopped-without-saving-the-next-round-is-told"),
        pytest.param(TOLD, R, False, 3, 1, 2, 160.0, SuspendMove.END, False,
                     id="still-unsaved-at-the-timeout"),
        pytest.param(TOLD, R, False, 3, 0, 2, 130.0, SuspendMove.REFORM, True,
                     id="nobody-saved-the-next-round-is-told"),
        pytest.param(TOLD, R, False, 3, 0, 0, 130.0, SuspendMove.END, False,
                     id="nobody-left"),
        pytest.param(TOLD, R, False, 2, 2, 0, 160.0, SuspendMove.END, False,
                     id="a-member-that-does-not-stop-in-time-is-left"),
    ],
)  # fmt: skip
def test_decide_suspension(
    progress: SuspendProgress,
    phase: DriverPhase,
    recovering: bool,
    stopped: int,
    saved: int,
    unsaved: int,
    now: float,
    move: SuspendMove,
    clean: bool,
) -> None:
    """Round 3 has 3 members: ``stopped`` of them are at the barrier or gone; of those at the
    barrier, ``saved`` saved their state and ``unsaved`` did not."""
    decision = decide_suspension(
        progress,
        phase,
        current_round=3,
        recovering=recovering,
        members=3,
        stopped=stopped,
        saved=saved,
        unsaved=unsaved,
        now=now,
        timeout_s=TIMEOUT_S,
    )
    assert (decision.move, decision.clean) == (move, clean)
    assert (move is SuspendMove.END) == bool(decision.reason)


def test_an_unclean_end_says_what_is_lost() -> None:
    decision = decide_suspension(
        TOLD,
        DriverPhase.RUNNING,
        current_round=3,
        recovering=False,
        members=3,
        stopped=2,
        saved=2,
        unsaved=0,
        now=200.0,
        timeout_s=TIMEOUT_S,
    )
    assert decision == SuspendDecision(
        SuspendMove.END,
        "1 of 3 workers of round 3 did not stop within 60 s; their steps since the last "
        "checkpoint are lost",
        clean=False,
    )


async def test_a_running_round_is_told_and_the_run_ends_once_every_member_asked() -> None:
    job = Job({"a": 1, "b": 1}, settings())
    await job.start_round_1(A0, B0)
    job.driver.suspend()
    await job.step()
    assert (NoticeKind.SUSPEND, ()) in await job.notices()
    assert job.driver.result is None
    await job.ask(A0, after_round=1, suspended=True)
    await job.step()
    assert job.driver.result is None, "b has not saved its state yet"
    await job.ask(B0, after_round=1, suspended=True)
    await job.step()
    result = job.driver.result
    assert result is not None and result.suspended and not result.success
    assert result.message == "suspended: the 2 workers of round 1 stopped for the suspension"
    assert job.driver.phase is DriverPhase.RUNNING, "no next round was formed"
    job.job.finish(result.message)  # what run() does on its way out
    assert (await job.ask(A0, after_round=1)).status is RendezvousStatus.FINISHED


async def test_a_member_that_never_stops_is_left_after_the_timeout() -> None:
    job = Job({"a": 1, "b": 1}, settings(suspend_timeout_s=30.0))
    await job.start_round_1(A0, B0)
    job.driver.suspend()
    await job.step()
    await job.ask(A0, after_round=1, suspended=True)
    job.clock.advance(30.0)
    await job.step()
    result = job.driver.result
    assert result is not None and result.suspended
    assert "1 of 2 workers of round 1 did not stop within 30 s" in result.message


async def test_a_job_suspended_before_its_first_round_ends_at_once() -> None:
    job = Job({"a": 1}, settings())
    await job.discover()
    await job.step()
    job.driver.suspend()
    await job.step()
    result = job.driver.result
    assert result is not None and result.suspended
    assert result.message == "suspended: no round was training yet"


async def test_no_newcomer_is_started_while_suspending() -> None:
    job = Job({"a": 1, "b": 1}, settings())
    await job.start_round_1(A0, B0)
    job.launcher.end(B0, 1)  # a recovery: the suspension waits for it
    job.driver.suspend()
    job.discovery.hosts["c"] = 1
    await job.discover()
    await job.step()
    await job.step()
    assert C0 not in job.launcher.started


async def test_a_member_failing_during_the_suspension_has_the_survivors_told_again() -> None:
    job = Job({"a": 1, "b": 1}, settings())
    await job.start_round_1(A0, B0)
    job.driver.suspend()
    await job.step()
    job.launcher.end(B0, 1)
    await job.ask(A0, after_round=1, rolled_back=True)
    await job.step()
    assert job.driver.result is None and job.driver.round == 2, "the survivor is told again"
    await job.step()
    await job.ask(A0, after_round=2, suspended=True)
    await job.step()
    result = job.driver.result
    assert result is not None and result.suspended
    assert result.message == "suspended: the 1 worker of round 2 stopped for the suspension"


async def test_a_suspension_during_a_recovery_waits_for_the_next_round_then_tells_it() -> None:
    job = Job({"a": 1, "b": 1}, settings())
    await job.start_round_1(A0, B0)
    job.launcher.end(B0, 1)  # the round fails; a rolls back
    job.driver.suspend()
    await job.step()
    assert NoticeKind.SUSPEND not in [kind for kind, _ in await job.notices()]
    await job.ask(A0, after_round=1, rolled_back=True)
    await job.step()
    assert job.driver.round == 2 and set(job.driver.slots) == {A0}
    await job.step()
    assert [kind for kind, _ in await job.notices()][-1] is NoticeKind.SUSPEND
    await job.ask(A0, after_round=2, suspended=True)
    await job.step()
    result = job.driver.result
    assert result is not None and result.suspended


async def test_members_that_stopped_for_another_notice_are_told_again_in_the_next_round() -> None:
    """Hosts were removed just before the suspension: the members stopped for that notice,
    without saving; the next round forms and is told to suspend, and its members save."""
    job = Job({"a": 1, "b": 1, "c": 1}, settings())
    await job.start_round_1(A0, B0, C0)
    job.discovery.hosts.pop("c")
    await job.discover()  # c leaves (HOSTS_REMOVED)
    job.driver.suspend()
    await job.step()
    for worker in (A0, B0, C0):  # they stopped for HOSTS_REMOVED
        await job.ask(worker, after_round=1)
    await job.step()
    assert job.driver.result is None
    assert job.driver.round == 2 and set(job.driver.slots) == {A0, B0}
    await job.step()
    notices = [kind for kind, _ in await job.notices()]
    assert notices.count(NoticeKind.SUSPEND) == 2, notices
    for worker in (A0, B0):
        await job.ask(worker, after_round=2, suspended=True)
    await job.step()
    result = job.driver.result
    assert result is not None and result.suspended
    assert "round 2 stopped for the suspension" in result.message


async def test_a_resumed_job_numbers_its_rounds_on_and_starts_afresh() -> None:
    """Without the checkpoint fallback: a resumed job's first round is a first round, not a
    round that lost every survivor."""
    job = Job({"a": 1, "b": 1}, settings(checkpoint_fallback=False))
    job.driver.continue_after(7)
    await job.discover()
    await job.step()
    for worker in (A0, B0):
        response = await job.ask(worker)
        assert response.status is RendezvousStatus.PENDING
    await job.step()
    assert job.driver.result is None
    assert job.driver.round == 8 and set(job.driver.slots) == {A0, B0}
    assert (await job.ask(A0)).round == 8
