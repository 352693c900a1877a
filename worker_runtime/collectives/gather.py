"""Horovod's allgather and grouped allgather, in all their forms: ``allgather`` (blocking and
differentiable) and ``allgather_async``; ``grouped_allgather`` and
``grouped_allgather_async``.

Each operation is described once (:func:`allgather_operation`,
:func:`grouped_allgather_operation`), with Horovod's signature; its forms are made from that
description (``operation_forms.py``). An allgather concatenates every rank's tensor along
dimension 0, in the process set's rank order; first dimensions may differ (a scalar counts as
one row): each rank's call tells the others its rows, so the data moves in one gather of
padded parts once the calls agree. Each result comes back on its input's device. The
gradient of an input is its rows of the output's gradient, averaged over the ranks (a scalar
input is not differentiated).

A grouped allgather is one negotiated operation: once the ranks agree it issues one gather per
tensor, in the list's order, and completes as one (Horovod fuses a group into one operation;
the results are the same).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
import torch.distributed as dist

from elasticjob.worker_runtime.collectives.call_descriptions import Call
from elasticjob.worker_runtime.collectives.issuing import start_allgather
from elasticjob.worker_runtime.collectives.negotiated_calls import Issued, describe
from elasticjob.worker_runtime.collectives.operation_forms import (
    Operation,
    async_form,
    blocking_form,
    first,
    listed,
    outputs,
)
from elasticjob.worker_runtime.collectives.process_sets import (
    ProcessSet,
    global_process_set,
    negotiation_of,
)
from elasticjob.worker_runtime.collectives.reduce import allreduce_operation
from elasticjob.worker_runtime.collectives.reduction_ops import Average

R = TypeVar("R")


def _issue(buffers: list[torch.Tensor], calls: Sequence[Call], group: dist.ProcessGroup) -> Issued:
    """One gather per tensor, every rank's rows known from its call."""
    started = [
        start_allgather(tensor, [call.shapes[index][0] for call in calls], group)
        for index, tensor in enumerate(buffers)
    ]

    def finish() -> list[torch.Tensor]:
        return [
            torch.cat(parts()).to(tensor.device)
            for (_, parts), tensor in zip(started, buffers, strict=True)
        ]

    return [work for work, _ in started], finish


def _own_rows(gradient: torch.Tensor, rows: int, process_set: ProcessSet) -> torch.Tensor:
    """This rank's ``rows`` of a gradient of an allgather's output, averaged over the ranks."""
    (averaged,) = outputs(allreduce_operation(gradient, None, None, Average, 1.0, 1.0, process_set))
    (counts,) = outputs(
        allgather_operation(torch.tensor([rows], dtype=torch.int64), None, process_set)
    )
    start = int(counts[: process_set.rank()].sum().item())
    return averaged.narrow(0, start, rows)


def _gathering(
    kind: str,
    form: Callable[[Sequence[torch.Tensor]], R],
    tensors: list[torch.Tensor],
    name: str | None,
    process_set: ProcessSet,
) -> Operation[R]:
    """The allgather (``kind``) of ``tensors``."""
    negotiation = negotiation_of(process_set)
    rows = [tensor.shape[0] if tensor.dim() else 1 for tensor in tensors]

    def gradient(
        gradients: Sequence[torch.Tensor], _fixed: Sequence[torch.Tensor]
    ) -> list[torch.Tensor]:
        pairs = zip(gradients, rows, strict=True)
        return [_own_rows(part, count, process_set) for part, count in pairs]

    differentiable = all(tensor.dim() for tensor in tensors)
    call = describe(kind, tensors)
    return Operation(
        negotiation,
        name,
        call,
        tuple(tensors),
        _issue,
        form,
        gradient=gradient if differentiable else None,
    )


def allgather_operation(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> Operation[torch.Tensor]:
    """Every rank's ``tensor`` (of ``process_set``) concatenated along dimension 0."""
    return _gathering("allgather", first, [tensor], name, process_set)


def grouped_allgather_operation(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Operation[list[torch.Tensor]]:
    """Every tensor of ``tensors`` gathered from every rank (of ``process_set``) along
    dimension 0, as one operation."""
    return _gathering("grouped_allgather", listed, list(tensors), name, process_set)


allgather_async = async_form(
    allgather_operation,
    """Start concatenating every rank's ``tensor`` along dimension 0 (first dimensions may
    differ); ``synchronize`` returns the result on ``tensor``'s device.""",
)
allgather = blocking_form(
    allgather_operation,
    "Concatenate every rank's ``tensor`` along dimension 0 (first dimensions may differ).",
)
grouped_allgather_async = async_form(
    grouped_allgather_operation,
    """Start gathering every tensor of ``tensors`` along dimension 0 from every rank (first
    dimensions may differ); ``synchronize`` returns the list of results, each on its input's
    device.""",
)
grouped_allgather = blocking_form(
    grouped_allgather_operation,
    """Gather every tensor of ``tensors`` from every rank along dimension 0 (first dimensions
    may differ); each result on its input's device.""",
)
