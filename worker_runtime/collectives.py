"""Collectives with Horovod's names and signatures, on the current round's group.

Every operation is issued asynchronously and waited on through the round's
:class:`~elasticjob.worker_runtime.process_group.RoundGroup`, so a failure anywhere in the
round surfaces as :class:`HorovodInternalError` within moments of the driver noticing it.
Tensors are moved to the round's device (the CPU under Gloo, ``cuda:local_rank`` under NCCL)
and results come back on the caller's device.
"""

from __future__ import annotations

import copy
import enum
import pickle
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from elasticjob.worker_runtime.basics import current


class ReduceOp(enum.Enum):
    """Reduction operations (Horovod's ``hvd.Average``, ``hvd.Sum``, ...)."""

    AVERAGE = "average"
    SUM = "sum"
    MIN = "min"
    MAX = "max"
    PRODUCT = "product"


Average = ReduceOp.AVERAGE
Sum = ReduceOp.SUM
Min = ReduceOp.MIN
Max = ReduceOp.MAX
Product = ReduceOp.PRODUCT

_TORCH_OPS = {
    ReduceOp.AVERAGE: dist.ReduceOp.SUM,
    ReduceOp.SUM: dist.ReduceOp.SUM,
    ReduceOp.MIN: dist.ReduceOp.MIN,
    ReduceOp.MAX: dist.ReduceOp.MAX,
    ReduceOp.PRODUCT: dist.ReduceOp.PRODUCT,
}


def _wait(work: Any) -> None:
    current().group.wait(work)


def allreduce_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """Reduce ``tensor`` across all ranks in place and return it (default: average)."""
    del name  # accepted for compatibility; collectives are matched by order
    if op is None:
        op = ReduceOp.SUM if average is False else ReduceOp.AVERAGE
    runtime = current()
    buffer = tensor.data if tensor.device == runtime.device else tensor.data.to(runtime.device)
    if prescale_factor != 1.0:
        buffer.mul_(prescale_factor)
    _wait(dist.all_reduce(buffer, op=_TORCH_OPS[op], async_op=True))
    scale = postscale_factor / (runtime.slot.size if op is ReduceOp.AVERAGE else 1)
    if scale != 1.0:
        if buffer.is_floating_point() or buffer.is_complex():
            buffer.mul_(scale)
        else:
            buffer.copy_(torch.div(buffer, 1 / scale, rounding_mode="floor"))
    if buffer is not tensor.data:
        tensor.data.copy_(buffer)
    return tensor


def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: ReduceOp | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """Return a new tensor holding ``tensor`` reduced across all ranks (default: average)."""
    return allreduce_(tensor.detach().clone(), average, name, op, prescale_factor, postscale_factor)


def _allgather_parts(tensor: torch.Tensor) -> list[torch.Tensor]:
    """Every rank's ``tensor`` (first dimensions may differ), on the round's device."""
    runtime = current()
    local = tensor.detach().to(runtime.device)
    if local.dim() == 0:
        local = local.reshape(1)
    sizes = torch.zeros(runtime.slot.size, dtype=torch.int64, device=runtime.device)
    sizes[runtime.slot.rank] = local.shape[0]
    _wait(dist.all_reduce(sizes, op=dist.ReduceOp.SUM, async_op=True))
    longest = int(sizes.max().item())
    padded = torch.zeros((longest, *local.shape[1:]), dtype=local.dtype, device=runtime.device)
    padded[: local.shape[0]] = local
    gathered = [torch.empty_like(padded) for _ in range(runtime.slot.size)]
    _wait(dist.all_gather(gathered, padded, async_op=True))
    return [part[: int(n)] for part, n in zip(gathered, sizes.tolist(), strict=True)]


def allgather(tensor: torch.Tensor, name: str | None = None) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along dimension 0 (first dimensions may differ)."""
    del name
    return torch.cat(_allgather_parts(tensor)).to(tensor.device)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> torch.Tensor:
    """Overwrite ``tensor`` with root's value, in place."""
    del name
    runtime = current()
    buffer = tensor.data if tensor.device == runtime.device else tensor.data.to(runtime.device)
    _wait(dist.broadcast(buffer, src=root_rank, async_op=True))
    if buffer is not tensor.data:
        tensor.data.copy_(buffer)
    return tensor


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None) -> torch.Tensor:
    """Return a new tensor holding root's ``tensor``."""
    return broadcast_(tensor.detach().clone(), root_rank, name)


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
    parts = _allgather_parts(_bytes_tensor(pickle.dumps(obj)))
    return [pickle.loads(part.cpu().numpy().tobytes()) for part in parts]


# ---- parameters and nested state -------------------------------------------------------


def _broadcast_tensors_(tensors: list[torch.Tensor], root_rank: int) -> None:
    """Broadcast tensors in place, one coalesced buffer per dtype."""
    runtime = current()
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for tensor in tensors:
        by_dtype.setdefault(tensor.dtype, []).append(tensor)
    for group in by_dtype.values():
        flat = torch.cat([t.detach().reshape(-1).to(runtime.device) for t in group])
        _wait(dist.broadcast(flat, src=root_rank, async_op=True))
        offset = 0
        for tensor in group:
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


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int) -> None:
    """Give every rank root's optimizer state (momentum buffers, step counts, hyper-parameters
    of each param group)."""
    state = broadcast_state(optimizer.state_dict(), root_rank)
    if current().slot.rank != root_rank:
        optimizer.load_state_dict(state)
