"""Horovod's allreduce and grouped allreduce, in all their forms: ``allreduce`` (blocking and
differentiable, with compression), ``allreduce_async``, ``allreduce_async_``, ``allreduce_``;
``grouped_allreduce`` and its ``_async``, ``_async_`` and ``_`` forms.

Each operation is described once (:func:`allreduce_operation`,
:func:`grouped_allreduce_operation`), with Horovod's signature; its forms are made from that
description (``operation_forms.py``). A reduction is Horovod's ``op`` (default: average;
``average=False``: sum) of every rank's tensor times ``prescale_factor``, the result times
``postscale_factor``; its gradient is the same reduction of the output's gradient. A grouped
reduction is one operation, carried as one flat buffer per dtype. The sparse allreduce is in
``sparse_allreduce.py``; reducescatter, which splits rows among ranks as alltoall does, in
``scatter.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import torch
import torch.distributed as dist

from elasticjob.worker_runtime.collectives.call_descriptions import Call
from elasticjob.worker_runtime.collectives.issuing import (
    Pending,
    by_dtype,
    flattened,
    start_allreduce_,
    unflatten_into,
)
from elasticjob.worker_runtime.collectives.negotiated_calls import SERVERS, Issued, describe
from elasticjob.worker_runtime.collectives.operation_forms import (
    Issue,
    Operation,
    async_form,
    compressed_outputs,
    first,
    in_place_form,
    listed,
    outputs,
)
from elasticjob.worker_runtime.collectives.process_sets import (
    ProcessSet,
    global_process_set,
    negotiation_of,
)
from elasticjob.worker_runtime.collectives.reduction_ops import (
    Compressor,
    ReduceOp,
    resolve_op,
    torch_op,
)

R = TypeVar("R")


@dataclass(frozen=True)
class ReduceArgs:
    """A reduction's arguments: how it reduces and scales, and over which ranks."""

    op: ReduceOp
    prescale_factor: float
    postscale_factor: float
    process_set: ProcessSet

    def start_(self, buffer: torch.Tensor, group: dist.ProcessGroup) -> Pending:
        """Issue this reduction of ``buffer``, in place, on ``group`` without waiting."""
        return start_allreduce_(
            buffer, None, self.op, self.prescale_factor, self.postscale_factor, group
        )


def reduction_call(kind: str, tensors: Sequence[torch.Tensor], reduction: ReduceArgs) -> Call:
    """This rank's call of a reduction (an allreduce or a reducescatter); refuses an
    operation that cannot run (Adasum) before any rank waits for it."""
    torch_op(reduction.op)
    return describe(
        kind,
        tensors,
        op=reduction.op.value,
        prescale=reduction.prescale_factor,
        postscale=reduction.postscale_factor,
    )


def _issue(
    reduction: ReduceArgs,
    buffers: list[torch.Tensor],
    _calls: Sequence[Call],
    group: dist.ProcessGroup,
) -> Issued:
    """One in-place allreduce of the single buffer."""
    pending = reduction.start_(buffers[0], group)
    return [pending.work], lambda: [pending.finish()]


def _issue_grouped(
    reduction: ReduceArgs,
    buffers: list[torch.Tensor],
    _calls: Sequence[Call],
    group: dist.ProcessGroup,
) -> Issued:
    """One in-place allreduce per dtype, of a flat buffer of that dtype's buffers."""
    started = [(reduction.start_(flattened(m), group), m) for m in by_dtype(buffers)]

    def finish() -> list[torch.Tensor]:
        for pending, members in started:
            unflatten_into(pending.finish(), members)
        return buffers

    return [pending.work for pending, _ in started], finish


def _serve(call: Call, group: dist.ProcessGroup, device: torch.device | None) -> Issued:
    """A joined rank's part of the others' allreduce ``call``: zeros of its dtypes and
    shapes, reduced as they reduce theirs (``negotiated_calls.SERVERS``)."""
    zeros = [
        torch.zeros(shape, dtype=getattr(torch, dtype), device=device)
        for dtype, shape in zip(call.dtypes, call.shapes, strict=True)
    ]
    assert call.op is not None
    reduction = ReduceArgs(ReduceOp(call.op), call.prescale, call.postscale, global_process_set)
    issue = _issue if call.kind == "allreduce" else _issue_grouped
    return issue(reduction, zeros, (), group)


SERVERS.update(allreduce=_serve, grouped_allreduce=_serve)


def _reduction(
    kind: str,
    issue: Callable[[ReduceArgs, list[torch.Tensor], Sequence[Call], dist.ProcessGroup], Issued],
    form: Callable[[Sequence[torch.Tensor]], R],
    tensors: list[torch.Tensor],
    name: str | None,
    reduction: ReduceArgs,
) -> Operation[R]:
    """The allreduce (``kind``) of ``tensors``, issued by ``issue``; its gradient is the same
    reduction of the outputs' gradients."""
    negotiation = negotiation_of(reduction.process_set)
    call = reduction_call(kind, tensors, reduction)

    def gradient(
        gradients: Sequence[torch.Tensor], _fixed: Sequence[torch.Tensor]
    ) -> list[torch.Tensor]:
        return outputs(_reduction(kind, issue, form, list(gradients), None, reduction))

    issued: Issue = partial(issue, reduction)
    return Operation(
        negotiation, name, call, tuple(tensors), issued, form, writes=True, gradient=gradient
    )


def allreduce_operation(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Operation[torch.Tensor]:
    """``tensor`` reduced across the ranks of ``process_set`` (default: average)."""
    reduction = ReduceArgs(resolve_op(average, op), prescale_factor, postscale_factor, process_set)
    return _reduction("allreduce", _issue, first, [tensor], name, reduction)


def grouped_allreduce_operation(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> Operation[list[torch.Tensor]]:
    """Every tensor of ``tensors`` reduced across the ranks of ``process_set`` (default:
    average), as one operation."""
    reduction = ReduceArgs(resolve_op(average, op), prescale_factor, postscale_factor, process_set)
    return _reduction("grouped_allreduce", _issue_grouped, listed, list(tensors), name, reduction)


allreduce_async = async_form(
    allreduce_operation,
    "Start reducing a copy of ``tensor``; ``synchronize`` returns the reduced copy.",
)
allreduce_async_ = async_form(
    allreduce_operation,
    "Start reducing ``tensor`` in place (default: average); ``synchronize`` returns it.",
    in_place=True,
)
allreduce_ = in_place_form(
    allreduce_operation,
    "Reduce ``tensor`` across all ranks in place and return it (default: average).",
)
grouped_allreduce_async = async_form(
    grouped_allreduce_operation,
    "Start reducing copies of ``tensors``; ``synchronize`` returns the list of results.",
)
grouped_allreduce_async_ = async_form(
    grouped_allreduce_operation,
    """Start reducing every tensor of ``tensors`` in place, as one operation;
    ``synchronize`` returns the list.""",
    in_place=True,
)
grouped_allreduce_ = in_place_form(
    grouped_allreduce_operation,
    "Reduce every tensor of ``tensors`` in place, as one operation, and return them.",
)


def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Return a new tensor holding ``tensor`` reduced across all ranks (default: average),
    compressed on the way if ``compression`` says so (``hvd.Compression.fp16``)."""
    (reduced,) = compressed_outputs(
        compression,
        [tensor],
        lambda sent: allreduce_operation(
            sent[0], average, name, op, prescale_factor, postscale_factor, process_set
        ),
    )
    return reduced


def grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    compression: type[Compressor] | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Return new tensors holding ``tensors`` reduced across all ranks (default: average),
    as one operation, compressed on the way if ``compression`` says so."""
    return compressed_outputs(
        compression,
        tensors,
        lambda sent: grouped_allreduce_operation(
            sent, average, name, op, prescale_factor, postscale_factor, process_set
        ),
    )
