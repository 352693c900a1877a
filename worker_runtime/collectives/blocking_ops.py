"""Horovod's blocking collectives as plain functions: the results of the round's
asynchronous collectives, waited for, with no autograd bookkeeping. ``autograd_collectives``
builds the API a script calls on them (forward and backward passes alike).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from elasticjob.worker_runtime.collectives.async_ops import (
    allgather_async,
    allreduce_,
    grouped_allreduce_async_,
)
from elasticjob.worker_runtime.collectives.grouped_ops import (
    grouped_allgather_async,
    grouped_reducescatter_async,
)
from elasticjob.worker_runtime.collectives.handles import synchronize
from elasticjob.worker_runtime.collectives.issuing import Compressor, ReduceOp, compressed_copy
from elasticjob.worker_runtime.collectives.process_sets import ProcessSet
from elasticjob.worker_runtime.collectives.scatter_ops import (
    Splits,
    alltoall_async,
    reducescatter_async,
)


def reduced(
    tensor: torch.Tensor,
    op: ReduceOp,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
    compression: type[Compressor] | None = None,
    *,
    name: str | None = None,
) -> torch.Tensor:
    """``tensor`` reduced across the ranks into a new tensor, compressed on the way."""
    copy, decompress = compressed_copy(tensor, compression)
    return decompress(
        allreduce_(copy, None, name, op, prescale_factor, postscale_factor, process_set)
    )


def grouped_reduced(
    tensors: Sequence[torch.Tensor],
    op: ReduceOp,
    prescale_factor: float,
    postscale_factor: float,
    process_set: ProcessSet,
    compression: type[Compressor] | None = None,
    *,
    name: str | None = None,
) -> list[torch.Tensor]:
    """``tensors`` reduced across the ranks as one operation, into new tensors."""
    copies = [compressed_copy(t, compression) for t in tensors]
    handle = grouped_allreduce_async_(
        [c for c, _ in copies], None, name, op, prescale_factor, postscale_factor, process_set
    )
    reduced: list[torch.Tensor] = synchronize(handle)
    return [decompress(r) for r, (_, decompress) in zip(reduced, copies, strict=True)]


def gathered(
    tensor: torch.Tensor, process_set: ProcessSet, *, name: str | None = None
) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along dimension 0, on ``tensor``'s device."""
    result: torch.Tensor = synchronize(allgather_async(tensor, name, process_set))
    return result


def grouped_gathered(
    tensors: Sequence[torch.Tensor], process_set: ProcessSet, *, name: str | None = None
) -> list[torch.Tensor]:
    """Every tensor of ``tensors`` gathered from every rank along dimension 0."""
    gathered: list[torch.Tensor] = synchronize(grouped_allgather_async(tensors, name, process_set))
    return gathered


def exchanged(
    tensor: torch.Tensor,
    splits: Splits | None,
    process_set: ProcessSet,
    *,
    name: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows every rank sent this rank, and how many came from each (alltoall)."""
    exchanged: tuple[torch.Tensor, torch.Tensor] = synchronize(
        alltoall_async(tensor, splits, name, process_set)
    )
    return exchanged


def scattered(
    tensor: torch.Tensor,
    op: ReduceOp,
    process_set: ProcessSet,
    prescale_factor: float,
    postscale_factor: float,
    compression: type[Compressor] | None = None,
    *,
    name: str | None = None,
) -> torch.Tensor:
    """This rank's rows of ``tensor`` reduced across the ranks (reduce-scatter)."""
    copy, decompress = compressed_copy(tensor, compression)
    handle = reducescatter_async(copy, name, op, process_set, prescale_factor, postscale_factor)
    result: torch.Tensor = decompress(synchronize(handle))
    return result


def grouped_scattered(
    tensors: Sequence[torch.Tensor],
    op: ReduceOp,
    process_set: ProcessSet,
    prescale_factor: float,
    postscale_factor: float,
    compression: type[Compressor] | None = None,
    *,
    name: str | None = None,
) -> list[torch.Tensor]:
    """This rank's rows of each tensor of ``tensors`` reduced across the ranks."""
    copies = [compressed_copy(t, compression) for t in tensors]
    handle = grouped_reducescatter_async(
        [c for c, _ in copies], name, op, process_set, prescale_factor, postscale_factor
    )
    reduced: list[torch.Tensor] = synchronize(handle)
    return [decompress(r) for r, (_, decompress) in zip(reduced, copies, strict=True)]
