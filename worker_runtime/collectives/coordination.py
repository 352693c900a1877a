"""Horovod's ``barrier`` and ``join`` on the current round's group.

``join`` is Horovod's: a rank out of data joins, and serves the allreduces the other ranks
still issue with zeros until every rank has joined (``negotiation.py``, whose sequence orders
the joins among the collectives); it returns the rank that joined last. Both wait through the
round's group, so a peer's failure raises :class:`HorovodInternalError` at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from elasticjob.worker_runtime.basics import current
from elasticjob.worker_runtime.collectives import reduce  # noqa: F401 (a joined rank serves its reductions)
from elasticjob.worker_runtime.collectives.call_descriptions import Call
from elasticjob.worker_runtime.collectives.handles import negotiated, synchronize
from elasticjob.worker_runtime.collectives.negotiated_calls import Issued, describe
from elasticjob.worker_runtime.collectives.process_sets import (
    ProcessSet,
    global_process_set,
    negotiation_of,
)


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


def join(device: int = -1) -> int:
    """Horovod's ``join``: this rank is out of data. Until every rank of the round has
    joined it takes part in the other ranks' allreduces with zeros (their averages still
    count it); other collectives the others call fail on them (not supported with join).
    Returns the rank that joined last. ``device`` is accepted for Horovod's signature (the
    zeros are made on the rank's device)."""
    del device
    runtime = current()
    work = runtime.group.negotiation.join()
    runtime.group.wait(work)
    return work.last
