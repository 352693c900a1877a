"""Horovod's ``grouped_allgather_async``, ``grouped_reducescatter_async`` and
``sparse_allreduce_async``, negotiated as every collective (``negotiation.py``; the blocking
forms are in ``autograd_ops.py``).

A grouped operation is one negotiated call; once the ranks agree it issues one collective per
tensor, in the list's order, and completes as one: its handle's ``synchronize`` returns the
list of results. Horovod fuses a group into one operation; here each member is its own
collective, which gives the same results.

``sparse_allreduce_async`` returns a function, as Horovod's does, that waits and gives the
reduced sparse tensor: every rank's indices and values gathered, averaged when ``op`` is
``Average``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from elasticjob.worker_runtime.collectives.call_descriptions import Call
from elasticjob.worker_runtime.collectives.handles import negotiated, synchronize
from elasticjob.worker_runtime.collectives.issuing import (
    Average,
    ReduceOp,
    start_allgather,
)
from elasticjob.worker_runtime.collectives.negotiation import Issued, describe
from elasticjob.worker_runtime.collectives.process_sets import (
    ProcessSet,
    global_process_set,
    negotiation_of,
)
from elasticjob.worker_runtime.collectives.scatter_ops import (
    reducescatter_call,
    start_reducescatter,
)


def grouped_allgather_async(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start gathering every tensor of ``tensors`` along dimension 0 from every rank (first
    dimensions may differ); ``synchronize`` returns the list of results, each on its input's
    device."""
    negotiation = negotiation_of(process_set)
    members = list(tensors)
    call = describe("grouped_allgather", members)

    def start(calls: Sequence[Call], group: dist.ProcessGroup) -> Issued:
        started = [
            start_allgather(tensor, [c.shapes[index][0] for c in calls], group)
            for index, tensor in enumerate(members)
        ]

        def finish() -> list[torch.Tensor]:
            return [
                torch.cat(parts()).to(tensor.device)
                for (_, parts), tensor in zip(started, members, strict=True)
            ]

        return [work for work, _ in started], finish

    return negotiated(negotiation, name, call, start)


def grouped_reducescatter_async(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    op: ReduceOp = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    """Start reducing every tensor of ``tensors`` across ranks (default: average);
    ``synchronize`` returns, for each, this rank's rows of the result (see
    :func:`~elasticjob.worker_runtime.collectives.scatter_ops.rows_of`)."""
    negotiation = negotiation_of(process_set)
    members = list(tensors)
    call = reducescatter_call(
        "grouped_reducescatter", members, op, prescale_factor, postscale_factor
    )

    def start(_calls: Sequence[Call], group: dist.ProcessGroup) -> Issued:
        started = [
            start_reducescatter(t, op, prescale_factor, postscale_factor, group) for t in members
        ]
        return [work for work, _ in started], lambda: [rows() for _, rows in started]

    return negotiated(negotiation, name, call, start)


def sparse_allreduce_async(
    tensor: torch.Tensor,
    name: str | None = None,
    op: ReduceOp | None = None,
    process_set: ProcessSet = global_process_set,
) -> Callable[[], torch.Tensor]:
    """Start reducing the sparse (COO) ``tensor`` across ranks: every rank's indices and
    values are gathered (duplicates are summed when the result is coalesced), and averaged
    when ``op`` is ``Average`` (``None`` sums, as in Horovod). Returns a function that waits
    and gives the reduced sparse tensor, as Horovod's does."""
    if not tensor.is_sparse:
        raise ValueError("sparse_allreduce_async needs a sparse COO tensor")
    operation = ReduceOp.SUM if op is None else op  # Horovod averages only for Average
    if operation not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        raise ValueError(f"sparse_allreduce_async supports Average and Sum, not {operation.name}")
    coalesced = tensor.coalesce()
    handle = grouped_allgather_async(
        [coalesced.indices().transpose(0, 1).contiguous(), coalesced.values()], name, process_set
    )
    size = len(process_set.ranks)

    def result() -> torch.Tensor:
        indices, values = synchronize(handle)
        if operation is ReduceOp.AVERAGE:
            values = values / size
        return torch.sparse_coo_tensor(
            indices.transpose(0, 1), values, tensor.shape, device=tensor.device
        ).coalesce()

    return result
