"""Issuing collectives on a group without waiting for them: an in-place allreduce or broadcast
(:class:`Pending`, finished once its work is done) and an allgather of parts whose first
dimensions may differ.

The negotiated collectives (``negotiation.py``) issue through these on their agreed group;
the runtime's own collectives (``round_syncs.py``, ``DistributedOptimizer``'s reducer) on the
round's group, in program order, waited on through the round's
:class:`~elasticjob.worker_runtime.rounds.process_group.RoundGroup` so that a failure anywhere
in the round surfaces as :class:`HorovodInternalError` within moments of the driver noticing
it. Tensors travel on the round's device (the CPU under Gloo, ``cuda:local_rank`` under NCCL)
and in its wire dtype (``wire_dtypes.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from elasticjob.worker_runtime.basics import current
from elasticjob.worker_runtime.collectives.reduction_ops import ReduceOp, resolve_op, torch_op
from elasticjob.worker_runtime.collectives.wire_dtypes import on_wire, scale_


def wait(work: Any) -> None:
    """Wait for ``work`` through the round's group (a failure of the round raises)."""
    current().group.wait(work)


@dataclass
class Pending:
    """A collective issued on a working buffer: once ``work`` has been waited on,
    :meth:`finish` scales a reduction and copies the buffer back to ``target`` if it is a copy
    of it on the round's device."""

    work: Any
    buffer: torch.Tensor
    target: torch.Tensor
    op: ReduceOp | None = None
    postscale_factor: float = 1.0
    size: int = 1
    """How many ranks a reduction's group has (what an average divides by)."""

    def finish(self) -> torch.Tensor:
        """Scale an average or postscaled reduction (Horovod's rule: ``wire_dtypes.scale_``),
        copy back (in ``target``'s dtype) and return ``target``."""
        buffer = self.buffer
        if self.op is not None:
            divisor = self.size if self.op is ReduceOp.AVERAGE else 1
            scale_(buffer, self.postscale_factor / divisor)
        if buffer.device != self.target.device or buffer.data_ptr() != self.target.data_ptr():
            self.target.data.copy_(buffer)
        return self.target


def start_allreduce_(
    tensor: torch.Tensor,
    average: bool | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    group: dist.ProcessGroup | None = None,
) -> Pending:
    """Issue an in-place allreduce of ``tensor`` on ``group`` (None: the round's) without
    waiting for it."""
    op = resolve_op(average, op)
    reduction = torch_op(op)
    buffer = on_wire(tensor)
    scale_(buffer, prescale_factor)
    work = dist.all_reduce(buffer, op=reduction, group=group, async_op=True)
    return Pending(work, buffer, tensor, op, postscale_factor, dist.get_world_size(group))


def gather_rows(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as an allgather sends it: on the round's device and wire dtype, a scalar
    as one row."""
    local = on_wire(tensor.detach())
    return local.reshape(1) if local.dim() == 0 else local


def start_allgather(
    tensor: torch.Tensor,
    rows: Sequence[int] | None = None,
    group: dist.ProcessGroup | None = None,
) -> tuple[Any, Callable[[], list[torch.Tensor]]]:
    """Issue the gather of every rank's ``tensor`` on ``group`` (None: the round's) without
    waiting: returns the work and a function giving the parts (on the round's device) once
    it is done. ``rows``: every rank's first dimension, when known (else exchanged first,
    waited on)."""
    runtime = current()
    local = gather_rows(tensor)
    if rows is None:
        sizes = torch.zeros(runtime.slot.size, dtype=torch.int64, device=runtime.device)
        sizes[runtime.slot.rank] = local.shape[0]
        wait(dist.all_reduce(sizes, op=dist.ReduceOp.SUM, async_op=True))
        rows = [int(n) for n in sizes.tolist()]
    longest = max(rows)
    padded = torch.zeros((longest, *local.shape[1:]), dtype=local.dtype, device=runtime.device)
    padded[: local.shape[0]] = local
    gathered = [torch.empty_like(padded) for _ in rows]
    work = dist.all_gather(gathered, padded, group=group, async_op=True)
    return work, lambda: [part[:n].to(tensor.dtype) for part, n in zip(gathered, rows, strict=True)]


def allgather_parts(tensor: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's ``tensor`` (first dimensions may differ), on the round's device."""
    work, parts = start_allgather(tensor)
    wait(work)
    return parts()


def start_broadcast_(
    tensor: torch.Tensor, root_rank: int, group: dist.ProcessGroup | None = None
) -> Pending:
    """Issue an in-place broadcast of root's ``tensor`` on ``group`` (None: the round's)
    without waiting for it."""
    buffer = on_wire(tensor)
    work = dist.broadcast(buffer, src=root_rank, group=group, async_op=True)
    return Pending(work, buffer, tensor)


def by_dtype(tensors: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    """``tensors`` in groups of one dtype each (in order of first appearance), as one flat
    buffer per dtype carries them."""
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault(tensor.dtype, []).append(tensor)
    return list(groups.values())


def flattened(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One flat buffer (on the round's device, in its wire dtype) holding ``tensors`` of one
    dtype, one after the other."""
    return on_wire(torch.cat([t.detach().reshape(-1) for t in tensors]))


def unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copy the consecutive pieces of the flat buffer ``flat`` back into ``tensors``."""
    offset = 0
    for tensor in tensors:
        n = tensor.numel()
        with torch.no_grad():
            tensor.copy_(flat[offset : offset + n].view_as(tensor))
        offset += n
