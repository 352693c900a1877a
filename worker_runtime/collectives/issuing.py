"""Collectives with Horovod's names and signatures, on the current round's group.

Every operation is issued asynchronously and waited on through the round's
:class:`~elasticjob.worker_runtime.rounds.process_group.RoundGroup`, so a failure anywhere in the
round surfaces as :class:`HorovodInternalError` within moments of the driver noticing it.
Tensors are moved to the round's device (the CPU under Gloo, ``cuda:local_rank`` under NCCL)
and results come back on the caller's device.
"""

from __future__ import annotations

import copy
import enum
import pickle
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from elasticjob.worker_runtime.basics import current
from elasticjob.worker_runtime.collectives.wire_dtypes import on_wire, scale_


class ReduceOp(enum.Enum):
    """Reduction operations (Horovod's ``hvd.Average``, ``hvd.Sum``, ...)."""

    AVERAGE = "average"
    SUM = "sum"
    MIN = "min"
    MAX = "max"
    PRODUCT = "product"
    ADASUM = "adasum"


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT
Adasum = ReduceOp.ADASUM
"""Accepted as a name only: every reduction given it raises :class:`NotImplementedError`."""

_TORCH_OPS = {
    ReduceOp.AVERAGE: dist.ReduceOp.SUM,
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
}


def torch_op(op: ReduceOp) -> dist.ReduceOp.RedOpType:
    """The ``torch.distributed`` operation behind ``op``; Adasum is refused by name."""
    if op is ReduceOp.ADASUM:
        raise NotImplementedError(
            "op=Adasum is not supported by elasticjob (no Adasum reduction over Gloo or "
            "NCCL groups here); use op=hvd.Average, Horovod's default, instead"
        )
    return _TORCH_OPS[op]


def resolve_op(average: bool | None, op: ReduceOp | None) -> ReduceOp:
    """Horovod's rule: ``op`` wins; else ``average=False`` means Sum, anything else Average."""
    if op is not None:
        return op
    return ReduceOp.SUM if average is False else ReduceOp.AVERAGE


def _wait(work: Any) -> None:
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


class Compressor(Protocol):
    """A compression of Horovod's ``hvd.Compression`` (``none``, ``fp16``)."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]: ...

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor: ...


def compressed_copy(
    tensor: torch.Tensor, compression: type[Compressor] | None
) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """A copy of ``tensor`` to reduce, compressed, and the function that decompresses the
    result."""
    if compression is None:
        return tensor.detach().clone(), lambda result: result
    compressed, ctx = compression.compress(tensor.detach())
    return compressed.clone(), lambda result: compression.decompress(result, ctx)


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
        _wait(dist.all_reduce(sizes, op=dist.ReduceOp.SUM, async_op=True))
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
    _wait(work)
    return parts()


def start_broadcast_(
    tensor: torch.Tensor, root_rank: int, group: dist.ProcessGroup | None = None
) -> Pending:
    """Issue an in-place broadcast of root's ``tensor`` on ``group`` (None: the round's)
    without waiting for it."""
    buffer = on_wire(tensor)
    work = dist.broadcast(buffer, src=root_rank, group=group, async_op=True)
    return Pending(work, buffer, tensor)


def _bytes_tensor(payload: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(current().device)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None) -> Any:
    """Return root's ``obj`` on every rank (pickled; keep it small, use
    :func:`broadcast_state` for structures holding large tensors)."""
    del name
    runtime = current()
    is_root = runtime.slot.rank == root_rank
    payload = pickle.dumps(obj) if is_root else b""
    length = torch.tensor([len(payload)], dtype=torch.int64, device=runtime.device)
    _wait(dist.broadcast(length, src=root_rank, async_op=True))
    buffer = (
        _bytes_tensor(payload)
        if is_root
        else torch.empty(int(length.item()), dtype=torch.uint8, device=runtime.device)
    )
    _wait(dist.broadcast(buffer, src=root_rank, async_op=True))
    return obj if is_root else pickle.loads(buffer.cpu().numpy().tobytes())


def allgather_object(obj: Any, name: str | None = None) -> list[Any]:
    """Return the list of every rank's ``obj``, in rank order."""
    del name
    parts = allgather_parts(_bytes_tensor(pickle.dumps(obj)))
    return [pickle.loads(part.cpu().numpy().tobytes()) for part in parts]


# ---- parameters and nested state -------------------------------------------------------


def _broadcast_tensors_(tensors: list[torch.Tensor], root_rank: int) -> None:
    """Broadcast tensors in place, one coalesced buffer per dtype."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for tensor in tensors:
        by_dtype.setdefault(tensor.dtype, []).append(tensor)
    for group in by_dtype.values():
        flat = on_wire(torch.cat([t.detach().reshape(-1) for t in group]))
        _wait(dist.broadcast(flat, src=root_rank, async_op=True))
        unflatten_into(flat, group)


def unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copy the consecutive pieces of the flat buffer ``flat`` back into ``tensors``."""
    offset = 0
    for tensor in tensors:
        n = tensor.numel()
        with torch.no_grad():
            tensor.copy_(flat[offset : offset + n].view_as(tensor))
        offset += n


def broadcast_parameters(
    params: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], root_rank: int
) -> None:
    """Overwrite every rank's parameters (a ``state_dict()`` or ``named_parameters()``) with
    root's, in place."""
    items = sorted(params.items() if isinstance(params, Mapping) else params)
    _broadcast_tensors_([tensor for _, tensor in items], root_rank)


@dataclass(frozen=True)
class _TensorSlot:
    index: int
    shape: tuple[int, ...]
    dtype: torch.dtype
    on_accelerator: bool


def _rebuild(obj: Any, leaf: Callable[[Any], Any]) -> Any:
    """Rebuild nested dicts, lists and tuples, keeping their types (an ``OrderedDict`` with its
    attributes, a ``defaultdict``, a named tuple), with ``leaf`` applied to everything else."""
    if isinstance(obj, dict):
        rebuilt = copy.copy(obj)
        for key, value in obj.items():
            rebuilt[key] = _rebuild(value, leaf)
        return rebuilt
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_rebuild(value, leaf) for value in obj))
    if isinstance(obj, list | tuple):
        return type(obj)(_rebuild(value, leaf) for value in obj)
    return leaf(obj)


def _split(state: Any, tensors: list[torch.Tensor]) -> Any:
    """``state`` with every tensor replaced by a :class:`_TensorSlot`; tensors go to ``tensors``."""

    def slot(leaf: Any) -> Any:
        if not isinstance(leaf, torch.Tensor):
            return leaf
        tensors.append(leaf)
        return _TensorSlot(
            len(tensors) - 1, tuple(leaf.shape), leaf.dtype, leaf.device.type != "cpu"
        )

    return _rebuild(state, slot)


def broadcast_state(state: Any, root_rank: int = 0) -> Any:
    """Return root's nested structure of dicts, lists, tuples, tensors and picklable values.
    The structure travels pickled; tensors travel as coalesced buffers and land on this
    rank's device (accelerator tensors) or the CPU."""
    runtime = current()
    tensors: list[torch.Tensor] = []
    skeleton = _split(state, tensors) if runtime.slot.rank == root_rank else None
    skeleton = broadcast_object(skeleton, root_rank)
    if runtime.slot.rank != root_rank:
        slots: list[_TensorSlot] = []
        _rebuild(
            skeleton, lambda leaf: slots.append(leaf) if isinstance(leaf, _TensorSlot) else None
        )
        tensors = [
            torch.empty(
                slot.shape,
                dtype=slot.dtype,
                device=runtime.device if slot.on_accelerator else torch.device("cpu"),
            )
            for slot in sorted(slots, key=lambda s: s.index)
        ]
    _broadcast_tensors_(tensors, root_rank)
    if runtime.slot.rank == root_rank:
        return state
    return _rebuild(
        skeleton, lambda leaf: tensors[leaf.index] if isinstance(leaf, _TensorSlot) else leaf
    )


def sync_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int) -> None:
    """Give every rank root's optimizer state (momentum buffers, step counts, hyper-parameters
    of each param group), as it is: the elastic state's sync, which must not change any
    weight."""
    state = broadcast_state(optimizer.state_dict(), root_rank)
    if current().slot.rank != root_rank:
        optimizer.load_state_dict(state)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int) -> None:
    """Horovod's ``broadcast_optimizer_state``: :func:`sync_optimizer_state`, after giving an
    optimizer without state yet its state as Horovod does (zero gradients and one step of
    the wrapped optimizer, no reduction; a weight decay moves the weights alike on every
    rank). ``torch.optim.LBFGS`` is refused, as in Horovod."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    if not optimizer.state_dict()["state"]:
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.requires_grad:
                    param.grad = torch.zeros_like(param)
        wrapped = next(c for c in type(optimizer).__mro__ if not c.__module__.startswith(_OURS))
        wrapped.step(optimizer)  # type: ignore[attr-defined]
    sync_optimizer_state(optimizer, root_rank)


_OURS = __name__.rsplit(".", 1)[0]
"""This package: ``DistributedOptimizer`` puts its class above the wrapped optimizer's."""
