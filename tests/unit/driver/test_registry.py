"""WorkerRegistry: the records of the current round."""

from __future__ import annotations

import pytest

from elasticjob.driver.decisions import Action, decide_round
from elasticjob.driver.registry import RoundRecords, WorkerRegistry
from elasticjob.wire.messages import WorkerId, WorkerState

R, S, F = WorkerState.READY, WorkerState.SUCCESS, WorkerState.FAILURE
A0, A1, B0, C0 = WorkerId("a", 0), WorkerId("a", 1), WorkerId("b", 0), WorkerId("c", 0)


class Rounds:
    """The members of the round in force, owned as the job's rendezvous owns them, and the
    registry that reads them."""

    def __init__(self) -> None:
        self.members: frozenset[WorkerId] = frozenset()
        self.number = 0
        self.registry = WorkerRegistry(lambda: self.members, lambda: self.number)

    def start_round(self, round_number: int, members: list[WorkerId]) -> None:
        self.members = frozenset(members)
        self.number = round_number


def test_registry_records_members_only() -> None:
    rounds = Rounds()
    registry = rounds.registry
    rounds.start_round(1, [A0, B0])
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
    rounds = Rounds()
    registry = rounds.registry
    rounds.start_round(1, [A0])
    for state in reports:
        registry.record(A0, state)
    assert registry.records().states == {A0: final}


def test_registry_new_round_forgets_previous_round() -> None:
    rounds = Rounds()
    registry = rounds.registry
    rounds.start_round(1, [A0, B0])
    registry.record(A0, F)
    registry.mark_rolled_back(A0)
    rounds.start_round(2, [A1, B0])
    assert registry.records() == RoundRecords(frozenset({A1, B0}), {}, frozenset(), frozenset())


def test_registry_leaving_and_rolled_back_members() -> None:
    rounds = Rounds()
    registry = rounds.registry
    rounds.start_round(3, [A0, A1, B0, C0])
    registry.mark_rolled_back(B0)
    registry.mark_rolled_back(WorkerId("z", 0))
    registry.record(A1, F)
    registry.record(C0, F)
    registry.record(A0, R)
    registry.record(B0, R)
    snapshot = registry.records(leaving={C0, WorkerId("z", 0)})
    assert snapshot.leaving == {C0}
    assert snapshot.rolled_back == {B0}
    decision = decide_round(snapshot, resets=registry.reset_count, reset_limit=None)
    assert decision.action is Action.RESUME
    assert "blacklisting hosts a" in decision.reason


def test_records_snapshot_is_not_affected_by_later_reports() -> None:
    rounds = Rounds()
    registry = rounds.registry
    rounds.start_round(1, [A0, B0])
    snapshot = registry.records()
    registry.record(A0, F)
    assert snapshot.states == {}


def test_count_reset() -> None:
    rounds = Rounds()
    registry = rounds.registry
    assert (registry.reset_count, registry.restart_count) == (0, 0)
    assert registry.count_reset(after_failure=False, committed_step=None) == 1
    rounds.start_round(1, [A0])
    assert registry.count_reset(after_failure=True, committed_step=None) == 2
    assert (registry.reset_count, registry.restart_count) == (2, 1)


def test_failed_rounds_in_a_row_are_counted_until_a_new_commit() -> None:
    registry = Rounds().registry
    assert registry.failed_rounds_without_commit(None) == 0
    registry.count_reset(after_failure=True, committed_step=None)
    registry.count_reset(after_failure=False, committed_step=None)  # hosts changed: no count
    registry.count_reset(after_failure=True, committed_step=None)
    assert registry.failed_rounds_without_commit(None) == 2
    assert registry.failed_rounds_without_commit(10) == 0, "a commit since: none in a row"
    registry.count_reset(after_failure=True, committed_step=10)
    assert registry.failed_rounds_without_commit(10) == 1
    registry.count_reset(after_failure=True, committed_step=10)
    assert registry.failed_rounds_without_commit(10) == 2
