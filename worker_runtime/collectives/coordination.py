"""Horovod's ``barrier`` and ``join`` on the current round's group.

``join`` here is a collective point where ranks that ran out of data wait for the others:
each rank calls it once it has nothing more to train on, it returns when every rank of the
round has called it, and it returns the rank that arrived last (the order in which the
round's store counted the arrivals). Unlike Horovod's, a rank that has joined does not serve
the collectives other ranks still issue: ranks must not issue other collectives once one of
them may have joined (with uneven data, let every rank run the same number of steps, or
reduce a "done" flag each step). Both wait through the round's group, so a peer's failure
raises :class:`HorovodInternalError` at once; ``join``'s count is one request to the round's
store (served by rank 0), which fails at once if rank 0 died and at the store's timeout if
it is cut off.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from elasticjob.worker_runtime.basics import current
from elasticjob.worker_runtime.collectives.call_descriptions import Call
from elasticjob.worker_runtime.collectives.handles import negotiated, synchronize
from elasticjob.worker_runtime.collectives.negotiation import Issued, describe
from elasticjob.worker_runtime.collectives.process_sets import (
    ProcessSet,
    global_process_set,
    negotiation_of,
)
from elasticjob.worker_runtime.exceptions import HorovodInternalError

_joins: dict[int, int] = {}
"""How many times this process has joined in each round (the store key of the next join)."""


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait until every rank of the round (of ``process_set``) has reached the barrier. A
    set's barrier is negotiated as its other collectives are (``negotiation.py``)."""
    negotiation = negotiation_of(process_set)
    if process_set is global_process_set:
        current().group.wait(dist.barrier(async_op=True))
        return
    mark = torch.zeros(1, dtype=torch.int32, device=current().device)

    def start(_calls: Sequence[Call], group: dist.ProcessGroup) -> Issued:
        return [dist.all_reduce(mark, group=group, async_op=True)], lambda: None

    synchronize(negotiated(negotiation, None, describe("barrier", [mark]), start))


def _arrival(round_number: int) -> int:
    """Count this rank's arrival at its next join of the round on the round's store; returns
    how many ranks had arrived, this one included."""
    runtime = current()
    store = runtime.round_store
    if store is None:  # a world of one formed without a store
        return 1
    count = _joins.get(round_number, 0) + 1
    _joins.clear()
    _joins[round_number] = count
    try:
        with runtime.group.blocking():
            return int(store.add(f"elasticjob/join/round-{round_number}/{count}", 1))
    except (RuntimeError, dist.DistError) as exc:
        raise HorovodInternalError(f"join: the round's store failed: {exc}") from exc


def join(device: int = -1) -> int:
    """Mark this rank as out of data and wait until every rank of the round has joined;
    returns the rank that joined last. ``device`` is accepted for Horovod's signature (no
    zero tensors are made here, see the module docstring)."""
    del device
    runtime = current()
    arrived = _arrival(runtime.round)
    last = runtime.slot.rank if arrived == runtime.slot.size else -1
    flag = torch.tensor([last], dtype=torch.int64, device=runtime.device)
    runtime.group.wait(dist.all_reduce(flag, op=dist.ReduceOp.MAX, async_op=True))
    return int(flag.item())
