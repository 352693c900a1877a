"""Horovod's ``join`` in the collective negotiation (``collectives/negotiation.py``), over real
Gloo groups and a real TCPStore, three ranks on threads of one process: a joined rank takes
part in the others' allreduces with zeros, other collectives fail on the ranks that called
them, every rank's join returns the rank that joined last, and a name's cached call is kept
in step across the join phase."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Iterator, Sequence

import pytest
import torch
import torch.distributed as dist

from elasticjob.worker_runtime.collectives import lingering
from elasticjob.worker_runtime.collectives.call_descriptions import Call
from elasticjob.worker_runtime.collectives.negotiated_calls import (
    SERVERS,
    Issued,
    JoinWork,
    NegotiatedCall,
    describe,
)
from elasticjob.worker_runtime.collectives.negotiation import Negotiation
from elasticjob.worker_runtime.exceptions import CollectiveMismatchError

SIZE = 3
TIMEOUT = datetime.timedelta(seconds=30)
DEADLINE_S = 30.0


def serve_sum(call: Call, group: dist.ProcessGroup, _device: torch.device | None) -> Issued:
    """A joined rank's part of a sum, as ``allreduce_sum`` issues it (the worker runtime's
    own server, in ``reduce.py``, reduces through the runtime of a worker process)."""
    zeros = torch.zeros(call.shapes[0])
    return [group.allreduce([zeros])], lambda: zeros


@pytest.fixture
def ranks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Negotiation]]:
    """The negotiations of a round of three ranks (one Gloo group each, made on threads of
    their own: making one waits for the others), closed at the end."""
    monkeypatch.setitem(SERVERS, "allreduce", serve_sum)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    made: list[dist.ProcessGroup | None] = [None] * SIZE

    def make(rank: int) -> None:
        prefixed = dist.PrefixStore("group", store.clone())  # type: ignore[attr-defined]
        made[rank] = dist.ProcessGroupGloo(prefixed, rank, SIZE, TIMEOUT)

    threads = [threading.Thread(target=make, args=(rank,)) for rank in range(SIZE)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_S)
    groups = [group for group in made if group is not None]
    assert len(groups) == SIZE, "the groups did not form in time"
    negotiations = [
        Negotiation(dist.PrefixStore("calls", store.clone()), rank, SIZE, groups[rank])  # type: ignore[attr-defined]
        for rank in range(SIZE)
    ]
    try:
        yield negotiations
    finally:
        for negotiation in negotiations:
            negotiation.close()
        assert lingering.settle(DEADLINE_S), "a closed negotiation's thread did not end"


def allreduce_sum(negotiation: Negotiation, name: str | None, value: float) -> NegotiatedCall:
    tensor = torch.tensor([value, 2 * value])

    def start(_calls: Sequence[Call], group: dist.ProcessGroup) -> Issued:
        return [group.allreduce([tensor])], lambda: tensor

    call = describe("allreduce", [tensor], op="sum")
    return negotiation.submit(name, call, start)


def allgather(negotiation: Negotiation) -> NegotiatedCall:
    tensor = torch.ones(2)

    def start(_calls: Sequence[Call], group: dist.ProcessGroup) -> Issued:
        raise AssertionError("an allgather with a joined rank must not start")

    return negotiation.submit(None, describe("allgather", [tensor]), start)


def done(work: NegotiatedCall | JoinWork) -> NegotiatedCall | JoinWork:
    """``work`` once it is done (failing the test past the deadline)."""
    finished = threading.Event()
    work.get_future().add_done_callback(lambda _future: finished.set())
    assert finished.wait(DEADLINE_S), "not done in time"
    return work


def test_a_joined_rank_adds_zeros_to_the_others_allreduces_and_join_returns_the_last(
    ranks: list[Negotiation],
) -> None:
    first = ranks[2].join()
    sums = [allreduce_sum(ranks[r], "x", r + 1.0) for r in (0, 1)]
    unnamed = [allreduce_sum(ranks[r], None, 10.0) for r in (0, 1)]
    for work in [*sums, *unnamed]:
        done(work)
    assert [w.result().tolist() for w in sums] == [[3.0, 6.0]] * 2
    assert [w.result().tolist() for w in unnamed] == [[20.0, 40.0]] * 2
    assert not first.is_completed(), "the others have not joined yet"
    joins = [first, ranks[0].join(), ranks[1].join()]
    for work in joins:
        done(work)
    lasts = {work.last for work in joins}  # the order in which the joins were published
    assert len(lasts) == 1 and lasts <= {0, 1}, "every rank: the same last, one of the two"
    # After the phase every rank calls again, the names' counts in step.
    again = [allreduce_sum(ranks[r], "x", r + 1.0) for r in range(SIZE)]
    more = [allreduce_sum(ranks[r], None, 1.0) for r in range(SIZE)]
    for work in [*again, *more]:
        done(work)
    assert [w.result().tolist() for w in again] == [[6.0, 12.0]] * SIZE
    assert [w.result().tolist() for w in more] == [[3.0, 6.0]] * SIZE


def test_a_cached_name_is_reduced_with_zeros_after_a_rank_joins(ranks: list[Negotiation]) -> None:
    """The name's second call is counted without being sent (the same call as last time):
    the joined rank's entry is still dropped, and after the phase it sends its call again."""
    for work in [allreduce_sum(ranks[r], "tensor_a", 1.0) for r in range(SIZE)]:
        done(work)
    joined = ranks[0].join()
    cached = [allreduce_sum(ranks[r], "tensor_a", 1.0) for r in (1, 2)]
    for work in cached:
        done(work)
    assert [w.result().tolist() for w in cached] == [[2.0, 4.0]] * 2
    for work in [joined, ranks[2].join(), ranks[1].join()]:
        done(work)
    final = [allreduce_sum(ranks[r], "tensor_a", 1.0) for r in range(SIZE)]
    for work in final:
        done(work)
    assert [w.result().tolist() for w in final] == [[3.0, 6.0]] * SIZE


def test_other_collectives_fail_on_the_ranks_that_call_them_while_one_has_joined(
    ranks: list[Negotiation],
) -> None:
    joined = ranks[1].join()
    calls = [allgather(ranks[r]) for r in (0, 2)]
    for work in calls:
        done(work)
        with pytest.raises(CollectiveMismatchError, match="Allgather is not supported with Join"):
            work.result()
    with pytest.raises(RuntimeError, match="has joined"):
        allreduce_sum(ranks[1], "y", 1.0)
    joins = [joined, ranks[0].join(), ranks[2].join()]
    for work in joins:
        done(work)
    assert len({work.last for work in joins}) == 1 and joined.last in (0, 2)


def test_join_with_a_collective_of_its_own_in_progress_is_refused(
    ranks: list[Negotiation],
) -> None:
    pending = allreduce_sum(ranks[0], "z", 1.0)
    with pytest.raises(RuntimeError, match="still in progress"):
        ranks[0].join()
    for work in [pending, allreduce_sum(ranks[1], "z", 1.0), allreduce_sum(ranks[2], "z", 1.0)]:
        done(work)
    assert pending.result().tolist() == [3.0, 6.0]
