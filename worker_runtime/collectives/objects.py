"""Horovod's ``broadcast_object`` and ``allgather_object``: picklable objects between ranks.

Over the global set they run as the runtime's own syncs do (``round_syncs.py``, matched in
call order on the round's group). Over another process set they travel as the set's
negotiated byte broadcasts and gathers (``broadcast.py``, ``gather.py``).
"""

from __future__ import annotations

import pickle
from typing import Any

import torch

from elasticjob.worker_runtime.basics import current
from elasticjob.worker_runtime.collectives import round_syncs
from elasticjob.worker_runtime.collectives.broadcast import broadcast_
from elasticjob.worker_runtime.collectives.gather import allgather
from elasticjob.worker_runtime.collectives.process_sets import (
    ProcessSet,
    global_process_set,
    negotiation_of,
)


def _bytes(payload: bytes) -> torch.Tensor:
    return (
        torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        if payload
        else torch.empty(0, dtype=torch.uint8)
    )


def broadcast_object(
    obj: Any,
    root_rank: int = 0,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """Return root's ``obj`` on every rank of ``process_set`` (pickled; ``root_rank`` is a
    global rank)."""
    if process_set is global_process_set:
        return round_syncs.broadcast_object(obj, root_rank)
    negotiation_of(process_set)
    is_root = current().slot.rank == root_rank
    payload = pickle.dumps(obj) if is_root else b""
    length = torch.tensor([len(payload)], dtype=torch.int64)
    prefix = None if name is None else f"{name}.length"
    broadcast_(length, root_rank, prefix, process_set)
    buffer = _bytes(payload) if is_root else torch.empty(int(length.item()), dtype=torch.uint8)
    broadcast_(buffer, root_rank, name, process_set)
    return obj if is_root else pickle.loads(buffer.numpy().tobytes())


def allgather_object(
    obj: Any, name: str | None = None, process_set: ProcessSet = global_process_set
) -> list[Any]:
    """Return every rank's ``obj`` (of ``process_set``), in rank order."""
    if process_set is global_process_set:
        return round_syncs.allgather_object(obj)
    payload = _bytes(pickle.dumps(obj))
    prefix = None if name is None else f"{name}.length"
    lengths = allgather(torch.tensor([payload.numel()]), prefix, process_set).tolist()
    data = allgather(payload, name, process_set)
    parts, offset = [], 0
    for length in lengths:
        parts.append(pickle.loads(data[offset : offset + length].numpy().tobytes()))
        offset += length
    return parts
