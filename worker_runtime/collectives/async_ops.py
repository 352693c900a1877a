"""Horovod's asynchronous collectives and the in-place blocking ones: ``allreduce_async(_)``,
``allreduce_``, ``grouped_allreduce(_)`` and the async variants of grouped reductions,
``broadcast_async(_)``, ``broadcast_``, ``allgather_async`` (the blocking forms with autograd
are in ``autograd_ops.py``).

Each returns a handle (:mod:`~elasticjob.worker_runtime.collectives.handles`) to pass to
``synchronize`` or ``poll``. The collective is submitted to the round's negotiation
(``negotiation.py``), which matches it by name with the other ranks' calls and issues it once
they agree; the function never waits for that. Grouped reductions travel as one buffer per dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from elasticjob.worker_runtime.collectives.call_descriptions import Call
from elasticjob.worker_runtime.collectives.handles import negotiated, synchronize
from elasticjob.worker_runtime.collectives.issuing import (
    Pending,
    ReduceOp,
    resolve_op,
    start_allgather,
    start_allreduce_,
    start_broadcast_,
    torch_op,
    unflatten_into,
)
from elasticjob.worker_runtime.collectives.negotiation import Issued, describe
from elasticjob.worker_runtime.collectives.process_sets import (
    ProcessSet,
    global_process_set,
    negotiation_of,
)
from elasticjob.worker_runtime.collectives.wire_dtypes import on_wire, scale_


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
    negotiation = negotiation_of(process_set)
    operation = resolve_op(average, op)
    torch_op(operation)  # refuses what cannot run, before any rank waits for this call
    call = describe(
        "allreduce",
        [tensor],
        op=operation.value,
        prescale=prescale_factor,
        postscale=postscale_factor,
    )

    def start(_calls: Sequence[Call], group: dist.ProcessGroup) -> Issued:
        pending = start_allreduce_(
            tensor, None, operation, prescale_factor, postscale_factor, group
        )
        return [pending.work], pending.finish

    return negotiated(negotiation, name, call, start)


def allreduce_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Reduce ``tensor`` across all ranks in place and return it (default: average)."""
    handle = allreduce_async_(
        tensor, average, name, op, prescale_factor, postscale_factor, process_set
    )
    result: torch.Tensor = synchronize(handle)
    return result


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
    group: dist.ProcessGroup,
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
        work = dist.all_reduce(flat, op=reduction, group=group, async_op=True)
        size = dist.get_world_size(group)
        pendings.append(Pending(work, flat, flat, op, postscale_factor, size))
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
    negotiation = negotiation_of(process_set)
    members = list(tensors)
    operation = resolve_op(average, op)
    torch_op(operation)
    call = describe(
        "grouped_allreduce",
        members,
        op=operation.value,
        prescale=prescale_factor,
        postscale=postscale_factor,
    )

    def start(_calls: Sequence[Call], group: dist.ProcessGroup) -> Issued:
        pendings, layouts = _start_grouped_(
            members, operation, prescale_factor, postscale_factor, group
        )

        def finish() -> list[torch.Tensor]:
            for pending, (flat, same_dtype) in zip(pendings, layouts, strict=True):
                pending.finish()
                unflatten_into(flat, same_dtype)
            return members

        return [p.work for p in pendings], finish

    return negotiated(negotiation, name, call, start)


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
    negotiation = negotiation_of(process_set)
    call = describe("broadcast", [tensor], root=root_rank)

    def start(_calls: Sequence[Call], group: dist.ProcessGroup) -> Issued:
        pending = start_broadcast_(tensor, root_rank, group)
        return [pending.work], pending.finish

    return negotiated(negotiation, name, call, start)


def broadcast_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Overwrite ``tensor`` with root's value, in place."""
    result: torch.Tensor = synchronize(broadcast_async_(tensor, root_rank, name, process_set))
    return result


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
    negotiation = negotiation_of(process_set)
    call = describe("allgather", [tensor])

    def start(calls: Sequence[Call], group: dist.ProcessGroup) -> Issued:
        work, parts = start_allgather(tensor, [c.shapes[0][0] for c in calls], group)
        return [work], lambda: torch.cat(parts()).to(tensor.device)

    return negotiated(negotiation, name, call, start)
