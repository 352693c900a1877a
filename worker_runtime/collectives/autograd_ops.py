"""Horovod's collectives as autograd functions: a loss computed from their outputs
back-propagates through them, with Horovod's gradients.

- ``allreduce``: the gradient is the allreduce of the output's gradient, with the same
  operation and scaling;
- ``allgather``: the average over the ranks of the output's gradient, this rank's rows of it;
- ``broadcast``: the average over the ranks of the output's gradient on the root, zero
  elsewhere;
- ``alltoall``: the output's gradient sent back where its rows came from;
- ``reducescatter``: the output's gradient gathered from every rank (times the number of
  ranks for a sum, and the scale factors);
- their grouped forms, tensor by tensor.

When no input requires a gradient (or gradients are disabled) the plain collective of
``blocking_ops.py`` runs, with no autograd bookkeeping. Compression
(``hvd.Compression.fp16``) is a cast on either side of the collective, so gradients flow
through it as well.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from elasticjob.worker_runtime.basics import current
from elasticjob.worker_runtime.collectives import blocking_ops as blocking
from elasticjob.worker_runtime.collectives.async_ops import broadcast_
from elasticjob.worker_runtime.collectives.issuing import (
    Average,
    Compressor,
    ReduceOp,
    Sum,
    resolve_op,
)
from elasticjob.worker_runtime.collectives.process_sets import (
    ProcessSet,
    global_process_set,
    negotiation_of,
)
from elasticjob.worker_runtime.collectives.scatter_ops import Splits


def _tracked(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether autograd follows a collective of ``tensors``."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


# ---- autograd ------------------------------------------------------------------------


def _compressed(
    tensor: torch.Tensor, compression: type[Compressor] | None
) -> tuple[torch.Tensor, Any]:
    return (tensor, None) if compression is None else compression.compress(tensor)


def _decompressed(
    tensor: torch.Tensor, compression: type[Compressor] | None, ctx: Any
) -> torch.Tensor:
    return tensor if compression is None else compression.decompress(tensor, ctx)


def _own_rows(gradient: torch.Tensor, rows: int, process_set: ProcessSet) -> torch.Tensor:
    """This rank's ``rows`` of a gradient of an allgather's output, averaged over the ranks."""
    averaged = blocking.reduced(gradient, Average, 1.0, 1.0, process_set)
    counts = blocking.gathered(torch.tensor([rows], dtype=torch.int64), process_set)
    start = int(counts[: process_set.rank()].sum().item())
    return averaged.narrow(0, start, rows)


def _scatter_scale(
    op: ReduceOp, process_set: ProcessSet, prescale_factor: float, postscale_factor: float
) -> float:
    """What a reduce-scatter's output gradient is scaled by before it is gathered."""
    return (len(process_set.ranks) if op is Sum else 1) * prescale_factor * postscale_factor


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        tensor: torch.Tensor,
        op: ReduceOp,
        prescale_factor: float,
        postscale_factor: float,
        process_set: ProcessSet,
        name: str | None,
    ) -> torch.Tensor:
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return blocking.reduced(tensor, *ctx.args, name=name)

    @staticmethod
    def backward(ctx: Any, gradient: torch.Tensor) -> tuple[Any, ...]:
        return blocking.reduced(gradient, *ctx.args), None, None, None, None, None


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        op: ReduceOp,
        prescale_factor: float,
        postscale_factor: float,
        process_set: ProcessSet,
        name: str | None,
        *tensors: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        ctx.args = (op, prescale_factor, postscale_factor, process_set)
        return tuple(blocking.grouped_reduced(tensors, *ctx.args, name=name))

    @staticmethod
    def backward(ctx: Any, *gradients: torch.Tensor) -> tuple[Any, ...]:
        return (None, None, None, None, None, *blocking.grouped_reduced(gradients, *ctx.args))


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, tensor: torch.Tensor, process_set: ProcessSet, name: str | None
    ) -> torch.Tensor:
        ctx.rows, ctx.process_set = tensor.shape[0], process_set
        return blocking.gathered(tensor, process_set, name=name)

    @staticmethod
    def backward(ctx: Any, gradient: torch.Tensor) -> tuple[Any, ...]:
        return _own_rows(gradient, ctx.rows, ctx.process_set), None, None


class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, process_set: ProcessSet, name: str | None, *tensors: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        ctx.rows, ctx.process_set = [t.shape[0] for t in tensors], process_set
        return tuple(blocking.grouped_gathered(tensors, process_set, name=name))

    @staticmethod
    def backward(ctx: Any, *gradients: torch.Tensor) -> tuple[Any, ...]:
        rows = zip(gradients, ctx.rows, strict=True)
        return (None, None, *(_own_rows(g, n, ctx.process_set) for g, n in rows))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, tensor: torch.Tensor, root_rank: int, process_set: ProcessSet, name: str | None
    ) -> torch.Tensor:
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return broadcast_(tensor.detach().clone(), root_rank, name, process_set)

    @staticmethod
    def backward(ctx: Any, gradient: torch.Tensor) -> tuple[Any, ...]:
        averaged = blocking.reduced(gradient, Average, 1.0, 1.0, ctx.process_set)
        if current().slot.rank != ctx.root_rank:  # a global rank, as in Horovod
            averaged = torch.zeros_like(averaged)
        return averaged, None, None, None


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        tensor: torch.Tensor,
        splits: Splits | None,
        process_set: ProcessSet,
        name: str | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        output, received = blocking.exchanged(tensor, splits, process_set, name=name)
        ctx.received, ctx.process_set = received, process_set
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx: Any, gradient: torch.Tensor, _received: Any) -> tuple[Any, ...]:
        sent_back, _ = blocking.exchanged(gradient, ctx.received, ctx.process_set)
        return sent_back, None, None, None


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        tensor: torch.Tensor,
        op: ReduceOp,
        process_set: ProcessSet,
        prescale_factor: float,
        postscale_factor: float,
        name: str | None,
    ) -> torch.Tensor:
        ctx.args = (op, process_set, prescale_factor, postscale_factor)
        return blocking.scattered(tensor, *ctx.args, name=name)

    @staticmethod
    def backward(ctx: Any, gradient: torch.Tensor) -> tuple[Any, ...]:
        gathered = blocking.gathered(gradient * _scatter_scale(*ctx.args), ctx.args[1])
        return gathered, None, None, None, None, None


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        op: ReduceOp,
        process_set: ProcessSet,
        prescale_factor: float,
        postscale_factor: float,
        name: str | None,
        *tensors: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        ctx.args = (op, process_set, prescale_factor, postscale_factor)
        return tuple(blocking.grouped_scattered(tensors, *ctx.args, name=name))

    @staticmethod
    def backward(ctx: Any, *gradients: torch.Tensor) -> tuple[Any, ...]:
        scale = _scatter_scale(*ctx.args)
        gathered = blocking.grouped_gathered([g * scale for g in gradients], ctx.args[1])
        return (None, None, None, None, None, *gathered)


# ---- Horovod's API ---------------------------------------------------------------------


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
    negotiation_of(process_set)  # refuses a set this rank cannot use, before autograd
    args = (resolve_op(average, op), prescale_factor, postscale_factor, process_set)
    if not _tracked([tensor]):
        return blocking.reduced(tensor, *args, compression, name=name)
    compressed, ctx = _compressed(tensor, compression)
    reduced = _Allreduce.apply(compressed, *args, name)  # type: ignore[no-untyped-call]
    return _decompressed(reduced, compression, ctx)


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
    negotiation_of(process_set)  # refuses a set this rank cannot use, before autograd
    args = (resolve_op(average, op), prescale_factor, postscale_factor, process_set)
    if not _tracked(tensors):
        return blocking.grouped_reduced(tensors, *args, compression, name=name)
    compressed = [_compressed(t, compression) for t in tensors]
    reduced = _GroupedAllreduce.apply(*args, name, *(c for c, _ in compressed))  # type: ignore[no-untyped-call]
    pairs = zip(reduced, compressed, strict=True)
    return [_decompressed(r, compression, ctx) for r, (_, ctx) in pairs]


def allgather(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along dimension 0 (first dimensions may differ)."""
    negotiation_of(process_set)  # refuses a set this rank cannot use, before autograd
    if not _tracked([tensor]) or tensor.dim() == 0:
        return blocking.gathered(tensor, process_set, name=name)
    result: torch.Tensor = _Allgather.apply(tensor, process_set, name)  # type: ignore[no-untyped-call]
    return result


def grouped_allgather(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Gather every tensor of ``tensors`` from every rank along dimension 0 (first dimensions
    may differ); each result on its input's device."""
    negotiation_of(process_set)  # refuses a set this rank cannot use, before autograd
    if not _tracked(tensors) or any(t.dim() == 0 for t in tensors):
        return blocking.grouped_gathered(tensors, process_set, name=name)
    return list(_GroupedAllgather.apply(process_set, name, *tensors))  # type: ignore[no-untyped-call]


def broadcast(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Return a new tensor holding root's ``tensor``."""
    negotiation_of(process_set)  # refuses a set this rank cannot use, before autograd
    if not _tracked([tensor]):
        return broadcast_(tensor.detach().clone(), root_rank, name, process_set)
    result: torch.Tensor = _Broadcast.apply(tensor, root_rank, process_set, name)  # type: ignore[no-untyped-call]
    return result


def alltoall(
    tensor: torch.Tensor,
    splits: Splits | None = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Scatter rows of ``tensor`` to every rank and gather theirs (see
    ``scatter_collectives.alltoall_async``); returns the gathered rows, and with ``splits``
    also how many came from each rank."""
    negotiation_of(process_set)  # refuses a set this rank cannot use, before autograd
    if not _tracked([tensor]) or tensor.dim() == 0:
        output, received = blocking.exchanged(tensor, splits, process_set, name=name)
    else:
        output, received = _Alltoall.apply(tensor, splits, process_set, name)  # type: ignore[no-untyped-call]
    return output if splits is None else (output, received)


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
    ``scatter_collectives.rows_of``), compressed on the way if ``compression`` says so."""
    negotiation_of(process_set)  # refuses a set this rank cannot use, before autograd
    args = (op, process_set, prescale_factor, postscale_factor)
    if not _tracked([tensor]):
        return blocking.scattered(tensor, *args, compression, name=name)
    compressed, ctx = _compressed(tensor, compression)
    reduced = _Reducescatter.apply(compressed, *args, name)  # type: ignore[no-untyped-call]
    return _decompressed(reduced, compression, ctx)


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
    negotiation_of(process_set)  # refuses a set this rank cannot use, before autograd
    args = (op, process_set, prescale_factor, postscale_factor)
    if not _tracked(tensors):
        return blocking.grouped_scattered(tensors, *args, compression, name=name)
    compressed = [_compressed(t, compression) for t in tensors]
    reduced = _GroupedReducescatter.apply(*args, name, *(c for c, _ in compressed))  # type: ignore[no-untyped-call]
    pairs = zip(reduced, compressed, strict=True)
    return [_decompressed(r, compression, ctx) for r, (_, ctx) in pairs]
