"""Horovod's collectives that split dimension 0 among the ranks, in all their forms:
``alltoall`` (blocking and differentiable) and ``alltoall_async``; ``reducescatter``,
``grouped_reducescatter`` (blocking and differentiable, with compression) and their
``_async`` forms.

Each operation is described once (:func:`alltoall_operation`,
:func:`reducescatter_operation`, :func:`grouped_reducescatter_operation`), with Horovod's
signature; its forms are made from that description (``operation_forms.py``).

``alltoall``'s call tells the other ranks how many rows it sends each of them, so the rows
move with one ``all_to_all_single`` once the calls agree; the gradient of its input is the
output's gradient sent back where its rows came from. ``reducescatter`` is a reduction
(``reduce.py``'s arguments and rules) whose result is split as Horovod splits dimension 0
(:func:`rows_of`: the first ``rows % size`` ranks get one row more); Gloo has no
reduce-scatter, so the whole tensor is reduced and each rank keeps its rows. Its gradient is
the output's gradient gathered from every rank (times the number of ranks for a sum, and the
scale factors). A grouped reducescatter is one negotiated operation issuing one reduction per
tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from elasticjob.worker_runtime.basics import current
from elasticjob.worker_runtime.collectives.call_descriptions import Call
from elasticjob.worker_runtime.collectives.gather import (
    allgather_operation,
    grouped_allgather_operation,
)
from elasticjob.worker_runtime.collectives.negotiated_calls import Issued, describe
from elasticjob.worker_runtime.collectives.operation_forms import (
    Operation,
    async_form,
    blocking_form,
    compressed_outputs,
    first,
    listed,
    outputs,
    paired,
)
from elasticjob.worker_runtime.collectives.process_sets import (
    ProcessSet,
    global_process_set,
    negotiation_of,
)
from elasticjob.worker_runtime.collectives.reduce import ReduceArgs, reduction_call
from elasticjob.worker_runtime.collectives.reduction_ops import (
    Average,
    Compressor,
    ReduceOp,
    Sum,
)
from elasticjob.worker_runtime.collectives.wire_dtypes import on_wire

R = TypeVar("R")

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


def alltoall_operation(
    tensor: torch.Tensor,
    splits: Splits | None = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Operation[torch.Tensor | tuple[torch.Tensor, torch.Tensor]]:
    """``splits[j]`` rows of ``tensor`` (in order, along dimension 0) sent to rank ``j`` of
    ``process_set`` (default: equal parts): the rows from every rank in rank order, and with
    ``splits`` also how many came from each (``synchronize`` returns both)."""
    negotiation = negotiation_of(process_set)
    runtime = current()
    send = _send_splits(tensor, splits, len(process_set.ranks))
    split_dtype = splits.dtype if isinstance(splits, torch.Tensor) else torch.int32

    def issue(
        buffers: list[torch.Tensor], calls: Sequence[Call], group: dist.ProcessGroup
    ) -> Issued:
        local = on_wire(buffers[0].detach())
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
        return [work], lambda: [output.to(tensor.device, tensor.dtype), received_splits]

    def gradient(
        gradients: Sequence[torch.Tensor], fixed: Sequence[torch.Tensor]
    ) -> list[torch.Tensor]:
        (received,) = fixed
        return outputs(alltoall_operation(gradients[0], received, None, process_set))[:1]

    form: Callable[[Sequence[torch.Tensor]], torch.Tensor | tuple[torch.Tensor, torch.Tensor]]
    form = first if splits is None else paired
    return Operation(
        negotiation,
        name,
        describe("alltoall", [tensor], splits=tuple(send)),
        (tensor,),
        issue,
        form,
        gradient=gradient if tensor.dim() else None,
        handle_form=paired,
    )


def rows_of(rank: int, rows: int, size: int) -> tuple[int, int]:
    """The first row and number of rows of dimension 0 that ``rank`` receives from a
    reduce-scatter of ``rows`` rows among ``size`` ranks."""
    base, extra = divmod(rows, size)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


def _issue_rows(
    reduction: ReduceArgs,
    buffers: list[torch.Tensor],
    group: dist.ProcessGroup,
) -> Issued:
    """One reduction of a copy of each buffer; the outputs are this rank's rows of each."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    started = [
        (reduction.start_(t.detach().clone(), group), rows_of(rank, t.shape[0], size))
        for t in buffers
    ]

    def finish() -> list[torch.Tensor]:
        return [
            pending.finish()[start : start + count].clone() for pending, (start, count) in started
        ]

    return [pending.work for pending, _ in started], finish


def _reducescatter(
    kind: str,
    form: Callable[[Sequence[torch.Tensor]], R],
    gather: Callable[[list[torch.Tensor], ProcessSet], Operation[Any]],
    tensors: list[torch.Tensor],
    name: str | None,
    reduction: ReduceArgs,
) -> Operation[R]:
    """The reduce-scatter (``kind``) of ``tensors``; its gradient is ``gather`` of the
    outputs' gradients, scaled."""
    negotiation = negotiation_of(reduction.process_set)
    if any(tensor.dim() == 0 for tensor in tensors):
        raise ValueError(f"{kind} needs tensors with at least one dimension")
    call = reduction_call(kind, tensors, reduction)
    ranks = len(reduction.process_set.ranks) if reduction.op is Sum else 1
    scale = ranks * reduction.prescale_factor * reduction.postscale_factor

    def gradient(
        gradients: Sequence[torch.Tensor], _fixed: Sequence[torch.Tensor]
    ) -> list[torch.Tensor]:
        return outputs(gather([g * scale for g in gradients], reduction.process_set))

    def issue(
        buffers: list[torch.Tensor], _calls: Sequence[Call], group: dist.ProcessGroup
    ) -> Issued:
        return _issue_rows(reduction, buffers, group)

    return Operation(negotiation, name, call, tuple(tensors), issue, form, gradient=gradient)


def reducescatter_operation(
    tensor: torch.Tensor,
    name: str | None = None,
    op: ReduceOp = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Operation[torch.Tensor]:
    """``tensor`` reduced across the ranks of ``process_set`` (default: average): this rank's
    rows of the result (see :func:`rows_of`)."""
    return _reducescatter(
        "reducescatter",
        first,
        lambda parts, ranks: allgather_operation(parts[0], None, ranks),
        [tensor],
        name,
        ReduceArgs(op, prescale_factor, postscale_factor, process_set),
    )


def grouped_reducescatter_operation(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    op: ReduceOp = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> Operation[list[torch.Tensor]]:
    """Every tensor of ``tensors`` reduced across the ranks of ``process_set`` (default:
    average), as one operation: this rank's rows of each result."""
    return _reducescatter(
        "grouped_reducescatter",
        listed,
        lambda parts, ranks: grouped_allgather_operation(parts, None, ranks),
        list(tensors),
        name,
        ReduceArgs(op, prescale_factor, postscale_factor, process_set),
    )


alltoall_async = async_form(
    alltoall_operation,
    """Start sending ``splits[j]`` rows of ``tensor`` (in order, along dimension 0) to rank
    ``j`` (default: equal parts); ``synchronize`` returns ``(received, received_splits)``:
    the rows from every rank in rank order, and how many came from each.""",
)
alltoall = blocking_form(
    alltoall_operation,
    """Scatter rows of ``tensor`` to every rank and gather theirs (see ``alltoall_async``);
    returns the gathered rows, and with ``splits`` also how many came from each rank.""",
)
reducescatter_async = async_form(
    reducescatter_operation,
    """Start reducing ``tensor`` across ranks (default: average); ``synchronize`` returns this
    rank's rows of the result (see :func:`rows_of`).""",
)
grouped_reducescatter_async = async_form(
    grouped_reducescatter_operation,
    """Start reducing every tensor of ``tensors`` across ranks (default: average);
    ``synchronize`` returns, for each, this rank's rows of the result (see
    :func:`rows_of`).""",
)


def reducescatter(
    tensor: torch.Tensor,
    name: str | None = None,
    compression: type[Compressor] | None = None,
    op: ReduceOp = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """Reduce ``tensor`` across ranks and return this rank's rows of the result (see
    :func:`rows_of`), compressed on the way if ``compression`` says so."""
    (rows,) = compressed_outputs(
        compression,
        [tensor],
        lambda sent: reducescatter_operation(
            sent[0], name, op, process_set, prescale_factor, postscale_factor
        ),
    )
    return rows


def grouped_reducescatter(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    compression: type[Compressor] | None = None,
    op: ReduceOp = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[torch.Tensor]:
    """Reduce every tensor of ``tensors`` across ranks and return this rank's rows of each
    result, compressed on the way if ``compression`` says so."""
    return compressed_outputs(
        compression,
        tensors,
        lambda sent: grouped_reducescatter_operation(
            sent, name, op, process_set, prescale_factor, postscale_factor
        ),
    )
