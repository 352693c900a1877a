"""The job's durable state: what :func:`job_state` takes from the driver's read model and its
blacklist, and how the journal carries the time suspended from one run to the next."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from elasticjob.driver.blacklist import Blacklist, BlacklistPolicy
from elasticjob.driver.driver_types import DriverPhase, JobResult
from elasticjob.driver.goodput import LostTime, LostTo
from elasticjob.driver.job_record import JobRecordData
from elasticjob.driver.job_snapshot import JobSnapshot
from elasticjob.driver.job_state import JobState, RoundMember, job_state
from elasticjob.driver.journal import JobJournal
from elasticjob.wire.messages import SlotInfo, WorkerId
from tests.support.clock import FakeClock

WALL = 1_800_000_000.0
"""The wall clock at the driver's clock's 1000.0."""


def slot(host: str, rank: int, size: int) -> SlotInfo:
    return SlotInfo(
        hostname=host,
        rank=rank,
        local_rank=0,
        cross_rank=rank,
        size=size,
        local_size=1,
        cross_size=size,
    )


def snapshot(result: JobResult | None = None) -> JobSnapshot:
    """Round 5 of a job with members b (rank 0) and a (rank 1), running since 400.0 with 30 s
    lost to startup, reset twice, after notice 7."""
    lost = LostTime(started_at=400.0, paused_since=None, paused_for=None)
    lost = lost.resumed({LostTo.STARTUP: 30.0}, 0.0)
    return JobSnapshot(
        now=1000.0,
        phase=DriverPhase.RUNNING,
        result=result,
        recovering=False,
        round=5,
        slots={WorkerId("b", 0): slot("b", 0, 2), WorkerId("a", 0): slot("a", 1, 2)},
        reset_count=2,
        restart_count=1,
        last_reset_reason="a worker on c failed",
        progress=None,
        committed_step=120,
        lost_time=lost,
        last_checkpoint=None,
        restore=None,
        notice_seq=7,
    )


def blacklist() -> Blacklist[str]:
    """Node n1 blacklisted twice, its cooldown ending 20.4 s after the snapshot."""
    clock = FakeClock(900.0)
    kept = Blacklist[str](BlacklistPolicy(10, 600), clock)
    kept.add("n1")
    clock.now = 1000.4
    kept.add("n1")  # the second blacklisting: 20 s, until 1020.4
    clock.now = 1000.0
    return kept


def test_a_training_job_keeps_its_round_resets_account_and_blacklisting() -> None:
    state = job_state(
        snapshot(), blacklist(), wall_now=WALL, suspended_seconds=12.0, suspended_since=None
    )
    assert state.round is not None
    assert (state.round.round, state.round.notice_seq) == (5, 7)
    assert state.round.members == (
        RoundMember(host="b", ranks=(0,)),
        RoundMember(host="a", ranks=(1,)),
    ), "by rank"
    assert (state.resets, state.restarts, state.last_round) == (2, 1, 5)
    assert (state.last_reset_reason, state.committed_step) == ("a worker on c failed", 120)
    assert state.running_seconds == 600.0
    assert state.lost_seconds[LostTo.STARTUP] == 30.0
    assert state.suspended_seconds == 12.0 and state.suspended_since is None
    (entry,) = state.blacklist
    assert (entry.key, entry.strikes) == ("n1", 2)
    assert entry.until == WALL + 21, "its wall-clock end, rounded up"


@pytest.mark.parametrize(
    "result",
    [
        JobResult(True, "done", 5, 2),
        JobResult(False, "suspended", 5, 2, suspended=True),
    ],
    ids=["over", "suspended"],
)
def test_a_job_whose_run_ended_has_no_round_in_force_but_numbers_on(result: JobResult) -> None:
    state = job_state(
        snapshot(result), blacklist(), wall_now=WALL, suspended_seconds=0, suspended_since=None
    )
    assert state.round is None and state.last_round == 5


def test_the_state_is_versioned_and_refuses_what_it_does_not_know() -> None:
    stored = JobRecordData(job="j", state=JobState(resets=1)).model_dump_json()
    assert '"version":1' in stored
    with pytest.raises(ValidationError):
        JobRecordData.model_validate_json(stored.replace('"version":1', '"version":2'))


def test_the_time_suspended_is_carried_from_one_run_to_the_next() -> None:
    wall = FakeClock(WALL)
    first = JobJournal(FakeClock(0.0))
    first.start_record("j", wall, "created")
    first.suspended("saved", 3)
    assert first.suspended_since == WALL
    stored = first.record_data(JobState(suspended_seconds=40.0, suspended_since=WALL))
    wall.now += 100.0
    second = JobJournal(FakeClock(0.0))
    second.resume_record(stored, wall)
    assert second.suspended_seconds == 140.0 and second.suspended_since is None
