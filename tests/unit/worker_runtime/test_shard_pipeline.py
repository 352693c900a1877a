"""The commit pipeline of a sharded state, its copies' thread replaced by a scripted outcome:
numbering from the commit a round resumed from, confirmation, a round's end settling the
commit in flight once (with the deadline a broken or a healthy round gets), rolling a pending
commit forward, and a copies' failure aborting only its own round's group."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from elasticjob.worker_runtime.elastic.sharded import shard_pipeline
from elasticjob.worker_runtime.elastic.sharded.shard_copies import Outcome
from elasticjob.worker_runtime.elastic.sharded.shard_exchange import Shards
from elasticjob.worker_runtime.elastic.sharded.shard_layout import MeshLayout
from elasticjob.worker_runtime.elastic.sharded.shard_pipeline import (
    SETTLE_TIMEOUT_S,
    CommitPipeline,
    settle_deadline,
)
from elasticjob.worker_runtime.elastic.sharded.shard_snapshot import ShardSnapshot
from elasticjob.worker_runtime.exceptions import HorovodInternalError

COPY: Shards = {}
FSDP_OF_TWO = MeshLayout(((0, 1),), hsdp=False)


class ScriptedFlight:
    """Stands for ``CopiesInFlight``: settles with the outcome the test sets."""

    outcome = Outcome.CONFIRMED
    flights: ClassVar[list[ScriptedFlight]] = []

    def __init__(
        self,
        snapshot: ShardSnapshot,
        layout: MeshLayout,
        holders: Mapping[int, Sequence[int]],
        group: Any,
        on_failure: Callable[[Any, str], None],
    ) -> None:
        self.group, self.on_failure, self.holders = group, on_failure, holders
        self.timeouts: list[float | None] = []
        self.seconds = 0.5
        ScriptedFlight.flights.append(self)

    def settle(self, timeout_s: float | None) -> tuple[Outcome, dict[int, Shards]]:
        self.timeouts.append(timeout_s)
        return self.outcome, {3: COPY} if self.outcome is not Outcome.FAILED else {}


@pytest.fixture
def pipeline(monkeypatch: pytest.MonkeyPatch) -> Iterator[CommitPipeline]:
    monkeypatch.setattr(shard_pipeline, "CopiesInFlight", ScriptedFlight)
    monkeypatch.setattr(ScriptedFlight, "outcome", Outcome.CONFIRMED)
    monkeypatch.setattr(ScriptedFlight, "flights", [])
    yield CommitPipeline(redundancy=1)


def runtime(step: int = 7) -> Any:
    aborted: list[str] = []
    return SimpleNamespace(step=step, group=SimpleNamespace(abort=aborted.append), aborted=aborted)


def snapshot() -> ShardSnapshot:
    return ShardSnapshot(shards=2, shard=0)


def start(pipeline: CommitPipeline, resumed_from: int = 4, round_runtime: Any = None) -> Any:
    round_runtime = round_runtime or runtime()
    pipeline.resume(resumed_from, None)
    pipeline.start_round(round_runtime, object(), ["node-a", "node-b"], FSDP_OF_TWO)
    return round_runtime


@pytest.mark.parametrize(
    ("broken", "deadline"),
    [(True, SETTLE_TIMEOUT_S), (False, None)],
    ids=["a broken round waits briefly", "a healthy round waits for the copies"],
)
def test_settle_deadline(broken: bool, deadline: float | None) -> None:
    assert settle_deadline(broken) == deadline


def test_commits_count_from_the_one_the_round_resumed_from(pipeline: CommitPipeline) -> None:
    start(pipeline, resumed_from=4)
    pipeline.commit(snapshot(), {"epoch": 1})
    assert pipeline.pending is not None and pipeline.pending.number == 5
    assert pipeline.pending.step == 7 and pipeline.pending.extras == {"epoch": 1}
    assert ScriptedFlight.flights[-1].holders == {0: (1,), 1: (0,)}
    confirmed = pipeline.wait()
    assert confirmed is not None and confirmed.number == 5 and confirmed.copies == {3: COPY}
    assert pipeline.pending is None and pipeline.copy_seconds == 0.5
    pipeline.commit(snapshot(), {})
    assert pipeline.wait() is not None and pipeline.confirmed is not None
    assert pipeline.confirmed.number == 6


def test_with_two_replicas_a_commit_sends_no_copies(pipeline: CommitPipeline) -> None:
    """HSDP's other replica holds every shard already: the commit is its snapshot and the
    barrier that confirms it."""
    pipeline.resume(0, None)
    two_pods = MeshLayout(((0, 1), (2, 3)), hsdp=True)
    pipeline.start_round(runtime(), object(), ["a", "a", "b", "b"], two_pods)
    pipeline.commit(snapshot(), {})
    assert ScriptedFlight.flights[-1].holders == {0: (), 1: (), 2: (), 3: ()}


def test_a_round_ends_once_and_a_commit_not_confirmed_stays_pending(
    pipeline: CommitPipeline,
) -> None:
    start(pipeline)
    pipeline.commit(snapshot(), {})
    pipeline.wait()
    ScriptedFlight.outcome = Outcome.PENDING  # a peer died before the barrier
    pipeline.commit(snapshot(), {})
    pipeline.end_round(broken=True)
    pipeline.end_round(broken=False)  # the group's destroy after the rollback: nothing left
    assert ScriptedFlight.flights[-1].timeouts == [SETTLE_TIMEOUT_S]
    assert pipeline.confirmed is not None and pipeline.confirmed.number == 5
    assert pipeline.pending is not None and pipeline.pending.number == 6
    assert pipeline.pending.copies == {3: COPY}
    with pytest.raises(HorovodInternalError, match="did not complete"):
        pipeline.wait()


def test_a_new_round_rolls_a_pending_commit_forward(pipeline: CommitPipeline) -> None:
    start(pipeline)
    ScriptedFlight.outcome = Outcome.PENDING
    pipeline.commit(snapshot(), {"batch": 3})
    holdings = pipeline.holdings()  # settles, as a healthy round's end
    assert ScriptedFlight.flights[-1].timeouts == [None]
    assert holdings.confirmed is None
    assert holdings.pending is not None and holdings.pending.number == 5
    held = pipeline.held(5)
    assert held is not None and pipeline.held(4) is None
    pipeline.resume(5, held)  # another member confirmed it
    assert pipeline.confirmed is held and pipeline.pending is None


def test_a_failure_of_the_copies_aborts_only_their_own_rounds_group(
    pipeline: CommitPipeline,
) -> None:
    first = start(pipeline)
    pipeline.commit(snapshot(), {})
    flight = ScriptedFlight.flights[-1]
    flight.on_failure(flight.group, "peer 1 died")
    assert first.aborted == ["peer 1 died"]
    ScriptedFlight.outcome = Outcome.FAILED
    pipeline.end_round(broken=True)
    flight.on_failure(flight.group, "late")  # the round is over: not the next one's failure
    assert first.aborted == ["peer 1 died"]
    assert pipeline.pending is not None and pipeline.pending.copies == {}
