"""The collective negotiation's threads (``collectives/negotiation.py``) over real Gloo groups
and a real TCPStore, two ranks in one process: a call carried out is held by no negotiation
thread while it waits for the next (the last reference to a call, to its works, must go on
the caller's thread: freed from a negotiation thread as the interpreter exits, a work's
destructor takes the GIL back and so ends that thread mid-destructor, aborting the worker),
and a closed negotiation's threads all end."""

from __future__ import annotations

import datetime
import gc
import threading
import time
import weakref
from collections.abc import Sequence

import torch
import torch.distributed as dist

from elasticjob.worker_runtime.collectives import lingering
from elasticjob.worker_runtime.collectives.call_descriptions import Call
from elasticjob.worker_runtime.collectives.negotiated_calls import Issued, describe
from elasticjob.worker_runtime.collectives.negotiation import Negotiation

TIMEOUT = datetime.timedelta(seconds=30)
DEADLINE_S = 30.0


def groups(store: dist.TCPStore) -> list[dist.ProcessGroup]:
    """A Gloo group of two ranks, both in this process (each made on a thread of its own,
    with a store client of its own: making one waits for the other)."""
    made: list[dist.ProcessGroup | None] = [None, None]

    def make(rank: int) -> None:
        prefixed = dist.PrefixStore("group", store.clone())  # type: ignore[attr-defined]
        made[rank] = dist.ProcessGroupGloo(prefixed, rank, 2, TIMEOUT)

    threads = [threading.Thread(target=make, args=(rank,)) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_S)
    assert all(group is not None for group in made), "the groups did not form in time"
    return [group for group in made if group is not None]


def allreduce(tensor: torch.Tensor) -> tuple[Call, object]:
    """This rank's call of a sum over ``tensor``, and how it starts once agreed."""

    def start(calls: Sequence[Call], group: dist.ProcessGroup) -> Issued:
        return [group.allreduce([tensor])], lambda: tensor

    return describe("allreduce", [tensor]), start


def released(freed: list[threading.Event], deadline_s: float) -> bool:
    """Whether every call was freed (its event set) within ``deadline_s``: a negotiation
    thread may still be returning from the call it carried out when its caller has the
    result, so the collector is run while waiting."""
    give_up = time.monotonic() + deadline_s
    for event in freed:
        while not event.wait(0.05):
            if time.monotonic() > give_up:
                return False
            gc.collect()
    return True


def test_a_call_carried_out_is_held_by_no_negotiation_thread_and_close_ends_them() -> None:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    ranks = groups(store)
    negotiations = [
        Negotiation(dist.PrefixStore("calls", store.clone()), rank, 2, ranks[rank])  # type: ignore[attr-defined]
        for rank in range(2)
    ]
    threads: list[threading.Thread] = []
    try:
        tensors = [torch.tensor([1.0]), torch.tensor([2.0])]
        freed = [threading.Event(), threading.Event()]
        pending = []
        for rank, negotiation in enumerate(negotiations):
            call, start = allreduce(tensors[rank])
            submitted = negotiation.submit("sum", call, start)  # type: ignore[arg-type]
            weakref.finalize(submitted, freed[rank].set)
            pending.append(submitted)
        for submitted in pending:
            submitted.wait()
        assert [t.tolist() for t in tensors] == [[3.0], [3.0]]
        del pending, submitted
        threads = [t for n in negotiations for t in n._threads]
        assert len(threads) == 4 and all(t.is_alive() for t in threads), "waiting for more calls"
        assert released(freed, DEADLINE_S), "a negotiation thread holds a call"
    finally:  # a failed check leaves no thread behind
        for negotiation in negotiations:
            negotiation.close()
        settled = lingering.settle(DEADLINE_S)
    assert settled, "a closed negotiation's thread did not end"
    assert not any(t.is_alive() for t in threads)
