"""Horovod's asynchronous and grouped collectives: ``allreduce_async(_)``,
``grouped_allreduce_`` and the async variants of grouped reductions, ``broadcast_async(_)``,
``allgather_async`` (the blocking ``grouped_allreduce`` is in ``autograd_collectives.py``).

Each returns a handle (:mod:`~elasticjob.worker_runtime.handles`) to pass to ``synchronize``
or ``poll``. The collective is issued on the round's group before the function returns, so
every rank must issue its asynchronous operations in the same order. ``allgather_async``
first exchanges the ranks' first dimensions (a short wait, abortable like every other), then
returns while the gather runs. Grouped reductions travel as one buffer per dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from elasticjob.worker_runtime.collectives import (
    Pending,
    ReduceOp,
    resolve_op,
    start_allgather,
    start_allreduce_,
    start_broadcast_,
    torch_op,
)
from elasticjob.worker_runtime.handles import issue, synchronize
from elasticjob.worker_runtime.process_sets import ProcessSet, check_process_set, global_process_set
from elasticjob.worker_runtime.wire_dtypes import on_wire, scale_


def allreduce_async_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start reducing ``tensor`` in place (default: average); ``synchronize`` returns it."""
    del name
    check_process_set(process_set)
    pending = start_allreduce_(tensor, average, op, prescale_factor, postscale_factor)
    return issue([pending.work], pending.finish)


def allreduce_async(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start reducing a copy of ``tensor``; ``synchronize`` returns the reduced copy."""
    return allreduce_async_(
        tensor.detach().clone(), average, name, op, prescale_factor, postscale_factor, process_set
    )


def _start_grouped_(
    tensors: Sequence[torch.Tensor],
    op: ReduceOp,
    prescale_factor: float,
    postscale_factor: float,
) -> tuple[list[Pending], list[tuple[torch.Tensor, list[torch.Tensor]]]]:
    """One in-place allreduce per dtype on a flat buffer of that dtype's tensors."""
    reduction = torch_op(op)
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for tensor in tensors:
        by_dtype.setdefault(tensor.dtype, []).append(tensor)
    pendings, layouts = [], []
    for members in by_dtype.values():
        flat = on_wire(torch.cat([t.detach().reshape(-1) for t in members]))
        scale_(flat, prescale_factor)
        work = dist.all_reduce(flat, op=reduction, async_op=True)
        pendings.append(Pending(work, flat, flat, op, postscale_factor))
        layouts.append((flat, members))
    return pendings, layouts


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start reducing every tensor of ``tensors`` in place, as one operation;
    ``synchronize`` returns the list."""
    del name
    check_process_set(process_set)
    members = list(tensors)
    pendings, layouts = _start_grouped_(
        members, resolve_op(average, op), prescale_factor, postscale_factor
    )

    def finish() -> list[torch.Tensor]:
        for pending, (flat, group) in zip(pendings, layouts, strict=True):
            pending.finish()
            offset = 0
            for tensor in group:
                n = tensor.numel()
                with torch.no_grad():
                    tensor.copy_(flat[offset : offset + n].view_as(tensor))
                offset += n
        return members

    return issue([p.work for p in pendings], finish)


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start reducing copies of ``tensors``; ``synchronize`` returns the list of results."""
    copies = [t.detach().clone() for t in tensors]
    return grouped_allreduce_async_(
        copies, average, name, op, prescale_factor, postscale_factor, process_set
    )


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Reduce every tensor of ``tensors`` in place, as one operation, and return them."""
    handle = grouped_allreduce_async_(
        tensors, average, name, op, prescale_factor, postscale_factor, process_set
    )
    result: list[torch.Tensor] = synchronize(handle)
    return result


def broadcast_async_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start overwriting ``tensor`` with root's value in place; ``synchronize`` returns it."""
    del name
    check_process_set(process_set)
    pending = start_broadcast_(tensor, root_rank)
    return issue([pending.work], pending.finish)


def broadcast_async(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start broadcasting root's ``tensor`` into a copy; ``synchronize`` returns the copy."""
    return broadcast_async_(tensor.detach().clone(), root_rank, name, process_set)


def allgather_async(
    tensor: torch.Tensor,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start concatenating every rank's ``tensor`` along dimension 0 (first dimensions may
    differ); ``synchronize`` returns the result on ``tensor``'s device."""
    del name
    check_process_set(process_set)
    work, parts = start_allgather(tensor)
    return issue([work], lambda: torch.cat(parts()).to(tensor.device))
