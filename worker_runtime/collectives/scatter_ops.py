"""Horovod's ``alltoall_async`` and ``reducescatter_async``, negotiated as every collective
(``negotiation.py``; the blocking forms are in ``autograd_ops.py``).

``alltoall``'s call tells the other ranks how many rows it sends each of them, so the rows
move with one ``all_to_all_single`` once the calls agree.
``reducescatter`` splits dimension 0 as Horovod does (the first ``rows % size`` ranks get one
row more); Gloo has no reduce-scatter, so the whole tensor is reduced and each rank keeps its
rows. The differentiable forms a script calls are in ``autograd_ops.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from elasticjob.worker_runtime.basics import current
from elasticjob.worker_runtime.collectives.call_descriptions import Call
from elasticjob.worker_runtime.collectives.handles import negotiated
from elasticjob.worker_runtime.collectives.issuing import (
    Average,
    ReduceOp,
    start_allreduce_,
    torch_op,
)
from elasticjob.worker_runtime.collectives.negotiation import Issued, describe
from elasticjob.worker_runtime.collectives.process_sets import (
    ProcessSet,
    global_process_set,
    negotiation_of,
)
from elasticjob.worker_runtime.collectives.wire_dtypes import on_wire

Splits = Sequence[int] | torch.Tensor


def _send_splits(tensor: torch.Tensor, splits: Splits | None, size: int) -> list[int]:
    if splits is None:
        rows = tensor.shape[0] if tensor.dim() else 1
        if rows % size:
            raise ValueError(
                f"alltoall without splits: dimension 0 ({rows}) is not a multiple of the "
                f"number of processes ({size})"
            )
        return [rows // size] * size
    counts = [int(n) for n in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
    if len(counts) != size or any(n < 0 for n in counts) or sum(counts) != tensor.shape[0]:
        raise ValueError(
            f"alltoall splits {counts} must give {size} non-negative counts adding up to "
            f"dimension 0 of the tensor ({tensor.shape[0]})"
        )
    return counts


def alltoall_async(
    tensor: torch.Tensor,
    splits: Splits | None = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start sending ``splits[j]`` rows of ``tensor`` (in order, along dimension 0) to rank
    ``j`` (default: equal parts); ``synchronize`` returns ``(received, received_splits)``:
    the rows from every rank in rank order, and how many came from each."""
    negotiation = negotiation_of(process_set)
    runtime = current()
    send = _send_splits(tensor, splits, len(process_set.ranks))
    call = describe("alltoall", [tensor], splits=tuple(send))
    split_dtype = splits.dtype if isinstance(splits, torch.Tensor) else torch.int32

    def start(calls: Sequence[Call], group: dist.ProcessGroup) -> Issued:
        local = on_wire(tensor.detach())
        if local.dim() == 0:
            local = local.reshape(1)
        counts = [(c.splits or ())[dist.get_rank(group)] for c in calls]
        output = torch.empty(
            (sum(counts), *local.shape[1:]), dtype=local.dtype, device=runtime.device
        )
        work = dist.all_to_all_single(
            output,
            local,
            output_split_sizes=counts,
            input_split_sizes=send,
            group=group,
            async_op=True,
        )
        received_splits = torch.tensor(counts, dtype=split_dtype)
        return [work], lambda: (output.to(tensor.device, tensor.dtype), received_splits)

    return negotiated(negotiation, name, call, start)


def rows_of(rank: int, rows: int, size: int) -> tuple[int, int]:
    """The first row and number of rows of dimension 0 that ``rank`` receives from a
    reduce-scatter of ``rows`` rows among ``size`` ranks."""
    base, extra = divmod(rows, size)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


def start_reducescatter(
    tensor: torch.Tensor,
    op: ReduceOp,
    prescale_factor: float,
    postscale_factor: float,
    group: dist.ProcessGroup,
) -> tuple[Any, Callable[[], torch.Tensor]]:
    """Issue the reduction of a copy of ``tensor`` on ``group`` without waiting: returns the
    work and a function giving this rank's rows of the result (see :func:`rows_of`) once it
    is done."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    first, count = rows_of(rank, tensor.shape[0], size)
    pending = start_allreduce_(
        tensor.detach().clone(), None, op, prescale_factor, postscale_factor, group
    )

    def rows() -> torch.Tensor:
        return pending.finish()[first : first + count].clone()

    return pending.work, rows


def reducescatter_call(
    kind: str,
    tensors: Sequence[torch.Tensor],
    op: ReduceOp,
    prescale_factor: float,
    postscale_factor: float,
) -> Call:
    """This rank's call of a (grouped) reduce-scatter; refuses scalars before any rank waits
    for it."""
    if any(tensor.dim() == 0 for tensor in tensors):
        raise ValueError(f"{kind} needs tensors with at least one dimension")
    torch_op(op)
    return describe(
        kind, tensors, op=op.value, prescale=prescale_factor, postscale=postscale_factor
    )


def reducescatter_async(
    tensor: torch.Tensor,
    name: str | None = None,
    op: ReduceOp = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    """Start reducing ``tensor`` across ranks (default: average); ``synchronize`` returns this
    rank's rows of the result (see :func:`rows_of`)."""
    negotiation = negotiation_of(process_set)
    call = reducescatter_call("reducescatter", [tensor], op, prescale_factor, postscale_factor)

    def start(_calls: Sequence[Call], group: dist.ProcessGroup) -> Issued:
        work, rows = start_reducescatter(tensor, op, prescale_factor, postscale_factor, group)
        return [work], rows

    return negotiated(negotiation, name, call, start)
