"""decide, decide_capacity and WorkerRegistry."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from elasticjob.driver.api import Action, CapacityAction
from elasticjob.driver.registry import RoundRecords, WorkerRegistry, decide, decide_capacity
from elasticjob.wire import WorkerId, WorkerState

R, S, F = WorkerState.READY, WorkerState.SUCCESS, WorkerState.FAILURE
A0, A1, B0, C0 = WorkerId("a", 0), WorkerId("a", 1), WorkerId("b", 0), WorkerId("c", 0)


def records(
    states: dict[WorkerId, WorkerState],
    members: tuple[WorkerId, ...] = (A0, A1, B0),
    removed: tuple[WorkerId, ...] = (),
) -> RoundRecords:
    return RoundRecords(frozenset(members), states, frozenset(removed))


@dataclass(frozen=True)
class Case:
    """One row of the decide table: members are a[0], a[1] and b[0]."""

    name: str
    states: dict[WorkerId, WorkerState]
    action: Action
    reason_parts: tuple[str, ...] = ()
    blacklist: frozenset[str] = frozenset()
    removed: tuple[WorkerId, ...] = ()
    resets: int = 0
    limit: int | None = None


AB = frozenset({"a", "b"})

DECIDE_CASES = [
    Case("wait-for-missing", {A0: R, A1: R}, Action.WAIT, ("1 of 3", "b[0]")),
    Case("wait-even-after-a-success", {A0: S, A1: F}, Action.WAIT, ("b[0]",)),
    Case("one-success-succeeds", {A0: S, A1: R, B0: F}, Action.SUCCEED, ("1 of 3", "a[0]")),
    Case("all-succeed-ignores-limit", {A0: S, A1: S, B0: S}, Action.SUCCEED, resets=9, limit=1),
    Case("all-failed", {A0: F, A1: F, B0: F}, Action.FAIL, ("all 3 workers failed", "b[0]")),
    Case(
        "one-failure-resumes",
        {A0: F, A1: R, B0: R},
        Action.RESUME,
        ("reset 1", "a[0]", "blacklisting hosts a"),
        blacklist=frozenset({"a"}),
    ),
    Case(
        "failures-within-limit",
        {A0: F, A1: R, B0: F},
        Action.RESUME,
        ("reset 3", "b[0]"),
        blacklist=AB,
        resets=2,
        limit=3,
    ),
    Case("all-ready-resumes", {A0: R, A1: R, B0: R}, Action.RESUME, ("no worker failed",)),
    Case(
        "reset-limit-exceeded",
        {A0: F, A1: R, B0: R},
        Action.FAIL,
        ("reset limit 3 exceeded", "a[0]"),
        resets=3,
        limit=3,
    ),
    Case("zero-reset-limit", {A0: R, A1: R, B0: R}, Action.FAIL, ("reset limit 0",), limit=0),
    Case("removed-not-awaited", {A0: R, A1: R}, Action.RESUME, ("reset 1",), removed=(B0,)),
    Case(
        "removed-failure-ignored",
        {A0: R, A1: R, B0: F},
        Action.RESUME,
        ("no worker failed",),
        removed=(B0,),
    ),
    Case(
        "all-counted-failed",
        {A0: F, A1: F, B0: F},
        Action.FAIL,
        ("all 2 workers failed",),
        removed=(B0,),
    ),
    Case("everyone-left", {}, Action.RESUME, ("left gracefully",), removed=(A0, A1, B0), limit=0),
    Case("non-member-ignored", {C0: F, A0: R, A1: R, B0: R}, Action.RESUME, ("no worker failed",)),
]


@pytest.mark.parametrize("case", DECIDE_CASES, ids=lambda case: case.name)
def test_decide(case: Case) -> None:
    recs = records(case.states, removed=case.removed)
    decision = decide(recs, resets=case.resets, reset_limit=case.limit)
    assert decision.action is case.action
    assert decision.blacklist == case.blacklist
    for part in case.reason_parts:
        assert part in decision.reason, decision.reason


def test_decide_shortens_long_worker_lists() -> None:
    members = tuple(WorkerId(f"h{i:02}", 0) for i in range(20))
    decision = decide(records({}, members=members), resets=0, reset_limit=None)
    assert decision.action is Action.WAIT
    assert "waiting for 20 of 20 workers" in decision.reason
    assert "and 12 more" in decision.reason


@pytest.mark.parametrize(
    ("available", "min_np", "since", "now", "expected"),
    [
        pytest.param(4, 4, None, 0.0, CapacityAction.PROCEED, id="enough"),
        pytest.param(8, 4, 0.0, 999.0, CapacityAction.PROCEED, id="more-than-enough-late"),
        pytest.param(3, 4, None, 500.0, CapacityAction.WAIT, id="just-started-waiting"),
        pytest.param(3, 4, 100.0, 159.9, CapacityAction.WAIT, id="within-timeout"),
        pytest.param(3, 4, 100.0, 160.0, CapacityAction.TIMEOUT, id="timeout-reached"),
        pytest.param(0, 1, 100.0, 1000.0, CapacityAction.TIMEOUT, id="long-past-timeout"),
    ],
)
def test_decide_capacity(
    available: int, min_np: int, since: float | None, now: float, expected: CapacityAction
) -> None:
    action = decide_capacity(
        available_slots=available,
        min_np=min_np,
        waiting_since=since,
        now=now,
        elastic_timeout_s=60.0,
    )
    assert action is expected


def test_registry_records_members_only() -> None:
    registry = WorkerRegistry()
    assert registry.round_number == 0
    registry.start_round(1, [A0, B0])
    assert registry.round_number == 1
    assert registry.record(A0, R)
    assert not registry.record(C0, F)
    assert registry.records() == RoundRecords(frozenset({A0, B0}), {A0: R}, frozenset())


@pytest.mark.parametrize(
    ("reports", "final"),
    [
        pytest.param([R, F], F, id="failure-overrides-ready"),
        pytest.param([R, S], S, id="success-overrides-ready"),
        pytest.param([F, R], F, id="failure-is-final"),
        pytest.param([S, F], S, id="success-is-final"),
        pytest.param([F, S], F, id="failure-not-overridden-by-success"),
        pytest.param([R, R], R, id="ready-twice"),
    ],
)
def test_registry_state_transitions(reports: list[WorkerState], final: WorkerState) -> None:
    registry = WorkerRegistry()
    registry.start_round(1, [A0])
    for state in reports:
        registry.record(A0, state)
    assert registry.records().states == {A0: final}


def test_registry_new_round_forgets_previous_round() -> None:
    registry = WorkerRegistry()
    registry.start_round(1, [A0, B0])
    registry.record(A0, F)
    registry.mark_removed([B0])
    registry.start_round(2, [A1, B0])
    assert registry.records() == RoundRecords(frozenset({A1, B0}), {}, frozenset())
    assert registry.failed_hosts() == frozenset()
    with pytest.raises(ValueError, match="round 2 must come after"):
        registry.start_round(2, [A0])


def test_registry_removed_members_and_failed_hosts() -> None:
    registry = WorkerRegistry()
    registry.start_round(3, [A0, A1, B0, C0])
    registry.mark_removed([C0, WorkerId("z", 0)])
    registry.record(A1, F)
    registry.record(C0, F)
    registry.record(A0, R)
    registry.record(B0, R)
    snapshot = registry.records()
    assert snapshot.removed == {C0}
    assert registry.failed_hosts() == {"a"}
    decision = decide(snapshot, resets=registry.reset_count, reset_limit=None)
    assert decision.action is Action.RESUME
    assert decision.blacklist == {"a"}


def test_records_snapshot_is_not_affected_by_later_reports() -> None:
    registry = WorkerRegistry()
    registry.start_round(1, [A0, B0])
    snapshot = registry.records()
    registry.record(A0, F)
    assert snapshot.states == {}


def test_count_reset() -> None:
    registry = WorkerRegistry()
    assert registry.reset_count == 0
    assert registry.count_reset() == 1
    registry.start_round(1, [A0])
    assert registry.count_reset() == 2
    assert registry.reset_count == 2
