"""The driver, step by step, when no worker of a round survives: with a checkpoint policy it
starts a round of fresh workers (whose rank 0 loads the newest checkpoint) and accounts the
checkpoints, the restore and the steps lost; without one the job fails and says how to turn
checkpoints on (see ``test_driver.py`` for the fakes)."""

from __future__ import annotations

import pytest

from elasticjob.driver.goodput import LostTo
from elasticjob.driver.job_record import EventKind
from elasticjob.wire.messages import (
    CheckpointReport,
    NoticeKind,
    ProgressRequest,
    ResultRequest,
    ScriptExit,
    WorkerId,
    WorkerState,
)
from tests.support.driver_job import A0, B0, C0, Job, RecordingObserver, settings


def checkpoint(step: int, seconds: float = 0.5) -> CheckpointReport:
    return CheckpointReport(
        name=f"ckpt-{step:08d}", epoch=0, step=step, seconds=seconds, size_bytes=1000
    )


def report(
    job: Job,
    round_number: int,
    step: int,
    *,
    resumed: bool = False,
    checkpoints: tuple[CheckpointReport, ...] = (),
    restored_from: CheckpointReport | None = None,
    commits: int = 0,
) -> None:
    job.job.report_progress(
        ProgressRequest(
            round=round_number,
            epoch=0,
            step=step,
            resumed=resumed,
            checkpoints=checkpoints,
            restored_from=restored_from,
            commit_seconds=(0.01,) * commits,
            committed_step=step if commits else None,
        )
    )


async def kill_everyone(job: Job, *workers: WorkerId) -> None:
    """SIGKILL every member at once: none reports anything, each process just ends."""
    for worker in workers:
        job.launcher.end(worker, -9)
    await job.step()


async def test_every_worker_killed_resumes_from_the_checkpoint_after_the_cooldown() -> None:
    """Every member SIGKILLed: their hosts are blacklisted, the driver waits for a cooldown
    to end instead of failing, then launches fresh workers (no survivor is assumed on the
    hosts that come back) and publishes a synced round; the restore is accounted: steps
    lost, rollback to the checkpoint, recovery until the resumed step."""
    job = Job({"a": 1, "b": 1}, settings(checkpoint_fallback=True))
    observer = job.driver.journal.observer = RecordingObserver()
    await job.start_round_1(A0, B0)
    report(job, 1, 0, resumed=True)
    job.clock.now += 10.0
    report(job, 1, 100, checkpoints=(checkpoint(100),), commits=10)
    job.clock.now += 10.0
    report(job, 1, 180, commits=8)
    job.clock.now += 2.0
    await kill_everyone(job, A0, B0)
    assert (await job.notices()) == [(NoticeKind.ROUND_FAILED, ("a",))]
    assert job.driver.result is None, job.driver.result
    assert job.hosts.blacklist.active().keys() == {"a", "b"}
    assert "all 2 workers were lost" in (job.driver.last_reset_reason or "")
    assert job.launcher.started == [A0, B0], "every host cools down: nobody to start"
    job.clock.now += 10.5
    await job.discover()
    await job.step()
    assert job.launcher.started == [A0, B0, A0, B0], "fresh processes on the same hosts"
    await job.ask(A0)
    await job.ask(B0)
    await job.step()
    assert job.driver.round == 2 and list(job.driver.slots) == [A0, B0]
    assert (await job.ask(A0, 0)).sync is True
    job.clock.now += 1.5
    report(job, 2, 100, resumed=True, restored_from=checkpoint(100, seconds=0.25))

    restore = job.driver.journal.restore
    assert restore is not None and restore.checkpoint.name == "ckpt-00000100"
    assert (restore.round, restore.steps_lost) == (2, 80)
    assert job.driver.journal.last_checkpoint == checkpoint(100)
    assert observer.checkpoints == [0.5]
    assert observer.recoveries == pytest.approx([12.0])
    lost = job.driver.journal.lost_time.lost_seconds(job.clock.now)
    # Trained again: from the checkpoint's commit (reported at 10 s, written in 0.5 s) to
    # the kill at 22 s (2 s of it since the last commit at 20 s, which a rollback loses
    # anyway); recovering: from the kill to the resumed step.
    assert lost[LostTo.ROLLBACK] == pytest.approx(22.0 - 9.5)
    assert lost[LostTo.RECOVERY] == pytest.approx(12.0)
    record = job.driver.journal.record.data({}, 1.0)
    events = [e.kind for e in record.events]
    assert events.count(EventKind.CHECKPOINT) == 1 and events.count(EventKind.RESTORED) == 1
    assert events.index(EventKind.RESTORED) > events.index(EventKind.FAILURE)
    resumed = record.events[-1]
    assert resumed.kind is EventKind.RESUMED and resumed.rolled_back_from is not None
    # The training thrown away began at the checkpoint's commit, 34 - 9.5 s before.
    assert resumed.t - resumed.rolled_back_from == pytest.approx(34.0 - 9.5)


async def test_every_worker_killed_without_checkpoints_fails_and_says_how_to_enable_them() -> None:
    job = Job({"a": 1, "b": 1}, settings())
    await job.start_round_1(A0, B0)
    await kill_everyone(job, A0, B0)
    assert job.driver.result is not None and not job.driver.result.success
    assert "all 2 workers failed" in job.driver.result.message
    assert "--checkpoint-dir" in job.driver.result.message


async def test_a_script_error_on_every_worker_fails_even_with_checkpoints() -> None:
    """Every member reported its script's error before ending: a restart would raise again."""
    job = Job({"a": 1, "b": 1}, settings(checkpoint_fallback=True))
    await job.start_round_1(A0, B0)
    for worker in (A0, B0):
        job.job.report_result(
            ResultRequest(
                hostname=worker.hostname,
                local_rank=worker.local_rank,
                state=WorkerState.FAILURE,
                script_exit=ScriptExit(exit_code=1, log_tail="ValueError: bad batch"),
            )
        )
    await kill_everyone(job, A0, B0)
    assert job.driver.result is not None and not job.driver.result.success
    assert "all 2 workers failed" in job.driver.result.message


@pytest.mark.parametrize("fallback", [True, False])
async def test_every_member_leaving_is_no_survivor(fallback: bool) -> None:
    """Every host of the round goes away at once (every pod evicted) and a new one comes:
    the leavers reach the barrier, but none is in the next round to sync it from. With
    checkpoints a fresh round starts from the newest one; without, the job fails instead of
    silently starting over from scratch."""
    job = Job({"a": 1, "b": 1}, settings(checkpoint_fallback=fallback))
    await job.start_round_1(A0, B0)
    report(job, 1, 0, resumed=True)
    job.discovery.hosts = {"c": 1}
    await job.discover()
    assert (await job.notices()) == [(NoticeKind.HOSTS_REMOVED, ("a", "b"))]
    await job.ask(A0, 1)
    await job.ask(B0, 1)
    await job.step()
    if not fallback:
        assert job.driver.result is not None and not job.driver.result.success
        assert "no worker of the previous round survives" in job.driver.result.message
        assert "spec.checkpoint" in job.driver.result.message
        return
    assert job.driver.result is None
    assert job.launcher.started[-1] == C0
    await job.ask(C0)
    await job.step()
    assert job.driver.round == 2 and list(job.driver.slots) == [C0]
    assert (await job.ask(C0, 0)).sync is True
    assert job.driver.journal.lost_time.paused_for is LostTo.RECOVERY, "a loss, not a resize"
