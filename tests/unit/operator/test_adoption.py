"""Taking a job over when its driver starts again, from the job's record: the round in force
and the blacklisting it holds, and the time suspended."""

from __future__ import annotations

from typing import Any

import pytest

from elasticjob.driver.blacklist import Blacklist, BlacklistPolicy
from elasticjob.driver.job_state import BlacklistEntry, JobState
from elasticjob.operator.adoption import recorded_round, restore_blacklist
from elasticjob.wire.messages import WorkerId
from tests.support.clock import FakeClock

WALL_NOW = 1_800_000_000.0
"""The wall clock when the new driver starts (2027-01-15T08:00:00Z)."""


def entries(*kept: tuple[str, float, int]) -> tuple[BlacklistEntry, ...]:
    """Entries of a record: (key, seconds after WALL_NOW its cooldown ends, strikes)."""
    return tuple(BlacklistEntry(key=k, until=WALL_NOW + s, strikes=n) for k, s, n in kept)


@pytest.mark.parametrize(
    ("recorded", "kept_for"),
    [
        (entries(("n1", 300, 1)), {"n1": 300.0}),
        (entries(("n1", 300, 1), ("n2", 10, 1)), {"n1": 300, "n2": 10}),
        (entries(("n1", -5, 1)), {}),
        ((), {}),
    ],
    ids=["one", "two", "already-over", "none"],
)
def test_restore_blacklist_keeps_nodes_out_until_their_recorded_end(
    recorded: tuple[BlacklistEntry, ...], kept_for: dict[str, float]
) -> None:
    clock = FakeClock(5000.0)  # the new process's monotonic clock has its own origin
    blacklist = Blacklist[str](BlacklistPolicy(10, 600), clock)
    restore_blacklist(blacklist, recorded, WALL_NOW, clock())
    assert dict(blacklist.active()) == {n: 5000.0 + s for n, s in kept_for.items()}
    for node, seconds in kept_for.items():
        clock.now = 5000.0 + seconds - 1
        assert node in blacklist
        clock.now = 5000.0 + seconds
        assert node not in blacklist


def test_restored_strikes_double_the_next_cooldown() -> None:
    clock = FakeClock(0.0)
    blacklist = Blacklist[str](BlacklistPolicy(10, 600), clock)
    restore_blacklist(blacklist, entries(("n1", 1, 3)), WALL_NOW, clock())
    assert blacklist.strikes("n1") == 3
    clock.now = 2.0
    assert blacklist.add("n1") == 2.0 + 80  # the 4th blacklisting: 10 * 2**3


def state_of(round_in_force: dict[str, Any] | None) -> JobState:
    return JobState.model_validate({"round": round_in_force})


@pytest.mark.parametrize(
    ("fields", "slots", "expected"),
    [
        (None, 1, None),
        ({"round": 3, "members": []}, 1, None),
        (
            {
                "round": 3,
                "notice_seq": 7,
                "members": [{"host": "b", "ranks": [1]}, {"host": "a", "ranks": [0]}],
            },
            1,
            (3, 7, ("a", "b"), {("a", 0): 0, ("b", 0): 1}),
        ),
        (
            {
                "round": 2,
                "members": [{"host": "a", "ranks": [0, 1]}, {"host": "b", "ranks": [2, 3]}],
            },
            2,
            (2, 0, ("a", "b"), {("a", 0): 0, ("a", 1): 1, ("b", 0): 2, ("b", 1): 3}),
        ),
        (
            {"round": 2, "members": [{"host": "a", "ranks": [0]}, {"host": "b", "ranks": [1]}]},
            2,
            None,
        ),
    ],
    ids=["none", "no-members", "one-slot", "two-slots", "slots-changed"],
)
def test_recorded_round(
    fields: dict[str, Any] | None,
    slots: int,
    expected: tuple[int, int, tuple[str, ...], dict[tuple[str, int], int]] | None,
) -> None:
    got = recorded_round(state_of(fields), slots)
    if expected is None:
        assert got is None
        return
    assert got is not None
    number, seq, order, ranks = expected
    assert (got.round, got.notice_seq, got.rank_order) == (number, seq, order)
    assert {(w.hostname, w.local_rank): s.rank for w, s in got.slots.items()} == ranks
    assert all(isinstance(w, WorkerId) for w in got.slots)


@pytest.mark.parametrize(
    ("state", "seconds"),
    [
        pytest.param(JobState(), 0.0, id="never-suspended"),
        pytest.param(JobState(suspended_seconds=30.0), 30.0, id="running-again"),
        pytest.param(
            JobState(suspended_seconds=30.0, suspended_since=WALL_NOW - 100), 130.0, id="now"
        ),
        pytest.param(JobState(suspended_since=WALL_NOW + 5), 0.0, id="a-wall-clock-stepped-back"),
    ],
)
def test_the_time_suspended_counts_the_suspension_under_way(
    state: JobState, seconds: float
) -> None:
    assert state.suspended_for(WALL_NOW) == seconds
