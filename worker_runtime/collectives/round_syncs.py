"""The runtime's own syncs on the round's group, matched in program order (no negotiation):
picklable objects, parameters, nested state holding tensors, optimizer state.

Every rank of the round calls them in the same order (the elastic state's sync, a checkpoint's
agreement, ``broadcast_parameters`` and ``broadcast_optimizer_state`` at the start of
training). Each waits through the round's group (``issuing.wait``), so a failure of the round
raises :class:`HorovodInternalError` at once.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from elasticjob.worker_runtime.basics import current
from elasticjob.worker_runtime.collectives.issuing import (
    allgather_parts,
    by_dtype,
    flattened,
    unflatten_into,
    wait,
)


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
    wait(dist.broadcast(length, src=root_rank, async_op=True))
    buffer = (
        _bytes_tensor(payload)
        if is_root
        else torch.empty(int(length.item()), dtype=torch.uint8, device=runtime.device)
    )
    wait(dist.broadcast(buffer, src=root_rank, async_op=True))
    return obj if is_root else pickle.loads(buffer.cpu().numpy().tobytes())


def allgather_object(obj: Any, name: str | None = None) -> list[Any]:
    """Return the list of every rank's ``obj``, in rank order."""
    del name
    parts = allgather_parts(_bytes_tensor(pickle.dumps(obj)))
    return [pickle.loads(part.cpu().numpy().tobytes()) for part in parts]


# ---- parameters and nested state -------------------------------------------------------


def _broadcast_tensors_(tensors: list[torch.Tensor], root_rank: int) -> None:
    """Broadcast tensors in place, one coalesced buffer per dtype."""
    for group in by_dtype(tensors):
        flat = flattened(group)
        wait(dist.broadcast(flat, src=root_rank, async_op=True))
        unflatten_into(flat, group)


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


_OURS = __name__.removesuffix(".collectives.round_syncs")
"""The worker runtime's package: ``DistributedOptimizer`` puts its class (made in its
``training`` package) above the wrapped optimizer's."""
