"""Taking a job over after an operator restart: the recorded round and the recorded
blacklisting."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from elasticjob.driver.blacklist import Blacklist, BlacklistPolicy
from elasticjob.operator.adoption import (
    blacklisted_nodes,
    recorded_round,
    restore_blacklist,
    running_round,
    suspended_seconds,
)
from elasticjob.operator.api import (
    BlacklistedNode,
    Condition,
    ConditionStatus,
    ConditionType,
    ElasticJobStatus,
    Goodput,
    Phase,
    WorkerStatus,
)
from elasticjob.wire.messages import WorkerId
from tests.support.clock import FakeClock

WALL_NOW = 1_800_000_000.0
"""The wall clock when the new operator starts (2027-01-15T08:00:00Z)."""


def at(offset_s: float) -> str:
    moment = datetime.datetime.fromtimestamp(WALL_NOW + offset_s, datetime.UTC)
    return moment.isoformat().replace("+00:00", "Z")


def status(**fields: Any) -> ElasticJobStatus:
    return ElasticJobStatus.model_validate(fields)


@pytest.mark.parametrize(
    ("recorded", "kept_for"),
    [
        ([{"node": "n1", "until": at(300)}], {"n1": 300.0}),
        (
            [{"node": "n1", "until": at(300)}, {"node": "n2", "until": at(10)}],
            {"n1": 300, "n2": 10},
        ),
        ([{"node": "n1", "until": at(-5)}], {}),
        ([], {}),
    ],
    ids=["one", "two", "already-over", "none"],
)
def test_restore_blacklist_keeps_nodes_out_until_their_recorded_end(
    recorded: list[dict[str, Any]], kept_for: dict[str, float]
) -> None:
    clock = FakeClock(5000.0)  # the new process's monotonic clock has its own origin
    blacklist = Blacklist[str](BlacklistPolicy(10, 600), clock)
    restore_blacklist(
        blacklist, status(blacklistedNodes=recorded).blacklisted_nodes, WALL_NOW, clock()
    )
    assert dict(blacklist.active()) == {n: 5000.0 + s for n, s in kept_for.items()}
    for node, seconds in kept_for.items():
        clock.now = 5000.0 + seconds - 1
        assert node in blacklist
        clock.now = 5000.0 + seconds
        assert node not in blacklist


def test_restored_strikes_double_the_next_cooldown() -> None:
    clock = FakeClock(0.0)
    blacklist = Blacklist[str](BlacklistPolicy(10, 600), clock)
    recorded = status(blacklistedNodes=[{"node": "n1", "until": at(1), "strikes": 3}])
    restore_blacklist(blacklist, recorded.blacklisted_nodes, WALL_NOW, clock())
    assert blacklist.strikes("n1") == 3
    clock.now = 2.0
    assert blacklist.add("n1") == 2.0 + 80  # the 4th blacklisting: 10 * 2**3


def test_the_status_records_what_a_restart_restores() -> None:
    clock = FakeClock(100.0)
    blacklist = Blacklist[str](BlacklistPolicy(30, 600), clock)
    blacklist.add("n1")
    blacklist.add("n1")  # 60 s, strikes 2
    clock.now = 100.5
    written = blacklisted_nodes(blacklist, WALL_NOW, clock())
    assert written == [
        BlacklistedNode(
            node="n1",
            until=datetime.datetime.fromtimestamp(WALL_NOW + 60, datetime.UTC),
            strikes=2,
        )
    ]
    dumped = ElasticJobStatus(blacklisted_nodes=written).model_dump(
        by_alias=True, exclude_none=True, mode="json"
    )
    assert dumped["blacklistedNodes"] == [{"node": "n1", "until": at(60), "strikes": 2}]
    # A new operator, its monotonic clock elsewhere, 20 s later by the wall clock.
    later = FakeClock(7.0)
    restored = Blacklist[str](BlacklistPolicy(30, 600), later)
    restore_blacklist(restored, status(**dumped).blacklisted_nodes, WALL_NOW + 20, later())
    assert dict(restored.active()) == {"n1": 7.0 + 40}
    assert restored.strikes("n1") == 2


@pytest.mark.parametrize(
    ("fields", "slots", "expected"),
    [
        ({}, 1, None),
        ({"round": 3, "workers": []}, 1, None),
        (
            {
                "round": 3,
                "noticeSeq": 7,
                "workers": [{"pod": "b", "ranks": [1]}, {"pod": "a", "ranks": [0]}],
            },
            1,
            (3, 7, ("a", "b"), {("a", 0): 0, ("b", 0): 1}),
        ),
        (
            {"round": 2, "workers": [{"pod": "a", "ranks": [0, 1]}, {"pod": "b", "ranks": [2, 3]}]},
            2,
            (2, 0, ("a", "b"), {("a", 0): 0, ("a", 1): 1, ("b", 0): 2, ("b", 1): 3}),
        ),
        (
            {"round": 2, "workers": [{"pod": "a", "ranks": [0]}, {"pod": "b", "ranks": [1]}]},
            2,
            None,
        ),
    ],
    ids=["no-status", "no-workers", "one-slot", "two-slots", "slots-changed"],
)
def test_recorded_round(
    fields: dict[str, Any],
    slots: int,
    expected: tuple[int, int, tuple[str, ...], dict[tuple[str, int], int]] | None,
) -> None:
    got = recorded_round(status(**fields), slots)
    if expected is None:
        assert got is None
        return
    assert got is not None
    number, seq, order, ranks = expected
    assert (got.round, got.notice_seq, got.rank_order) == (number, seq, order)
    assert {(w.hostname, w.local_rank): s.rank for w, s in got.slots.items()} == ranks
    assert all(isinstance(w, WorkerId) for w in got.slots)


WORKER = WorkerStatus(pod="p-0", ranks=[0])
SUSPENDED_AT = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)


def suspended_condition(status: ConditionStatus) -> Condition:
    return Condition(type=ConditionType.SUSPENDED, status=status, last_transition_time=SUSPENDED_AT)


@pytest.mark.parametrize(
    ("status", "seconds"),
    [
        pytest.param(ElasticJobStatus(), 0.0, id="never-suspended"),
        pytest.param(
            ElasticJobStatus(goodput=Goodput(suspended_seconds=30.0)), 30.0, id="running-again"
        ),
        pytest.param(
            ElasticJobStatus(
                phase=Phase.SUSPENDED,
                goodput=Goodput(suspended_seconds=30.0),
                conditions=[suspended_condition(ConditionStatus.TRUE)],
            ),
            130.0,
            id="suspended-now",
        ),
    ],
)
def test_the_time_suspended_counts_the_suspension_under_way(
    status: ElasticJobStatus, seconds: float
) -> None:
    assert suspended_seconds(status, SUSPENDED_AT.timestamp() + 100) == seconds


@pytest.mark.parametrize(
    ("status", "running"),
    [
        pytest.param(ElasticJobStatus(), False, id="new"),
        pytest.param(ElasticJobStatus(round=3, workers=[WORKER]), True, id="training"),
        pytest.param(ElasticJobStatus(round=3), False, id="no-member-recorded"),
        pytest.param(
            ElasticJobStatus(phase=Phase.SUSPENDED, round=3, workers=[WORKER]),
            False,
            id="suspended",
        ),
    ],
)
def test_running_round(status: ElasticJobStatus, running: bool) -> None:
    assert running_round(status) is running
