"""Which backend and device a worker process uses: under NCCL, one GPU per slot.

A GPU pod asks for as many GPUs as it runs worker processes (``resources.limits``
``nvidia.com/gpu`` equal to ``slotsPerWorker``); the device plugin makes those GPUs visible to
every process of the pod as CUDA devices ``0..N-1``, and the slot with local rank ``k`` uses
``cuda:k``, as a horovodrun script does with ``torch.cuda.set_device(hvd.local_rank())``
(which therefore keeps working: it sets the device the runtime already set). The visible
devices are left alone, so that every process sees the same numbering.

A launcher that instead gives each process one device of its own (``CUDA_VISIBLE_DEVICES``
naming a single device per process) is honoured: that device is ``cuda:0``.

:func:`resolve_backend` picks the backend; :func:`device_for_slot` decides the device, from
plain values; the runtime applies its plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class DeviceError(RuntimeError):
    """A worker process has no device it can use for the requested backend."""


@dataclass(frozen=True)
class DevicePlan:
    """The device of a worker process and what to set for it."""

    device: torch.device
    """Where the round's collectives run (``cuda:k`` under NCCL, the CPU under Gloo)."""
    cuda_index: int | None
    """What to pass to ``torch.cuda.set_device`` (None: nothing to set)."""
    physical: str | None = None
    """The ``CUDA_VISIBLE_DEVICES`` entry (an index or a ``GPU-`` UUID) that names the device
    on its machine, when the variable is set: for the log, to check against ``nvidia-smi``."""


def resolve_backend(requested: str) -> str:
    """``auto`` means NCCL when CUDA is available, else Gloo."""
    if requested == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if requested not in ("gloo", "nccl"):
        raise ValueError(f"backend must be gloo, nccl or auto, got {requested!r}")
    return requested


def visible_devices(value: str | None) -> tuple[str, ...] | None:
    """The entries of ``CUDA_VISIBLE_DEVICES`` (None: the variable is unset, every device
    the container has is visible). CUDA ignores an entry that names no device and every entry
    after it; here the list is only used to name devices, so it is taken as written."""
    if value is None:
        return None
    return tuple(entry.strip() for entry in value.split(",") if entry.strip())


def device_for_slot(
    local_rank: int, backend: str, device_count: int, cuda_visible_devices: str | None
) -> DevicePlan:
    """The device of the worker process in slot ``local_rank`` of its host.

    ``backend``: ``gloo`` or ``nccl`` (resolved, not ``auto``); ``device_count``: the CUDA
    devices the process sees (``torch.cuda.device_count()``); ``cuda_visible_devices``: the
    process's ``CUDA_VISIBLE_DEVICES``. Raises :class:`DeviceError` naming what to change when
    NCCL has no device of its own for the slot (NCCL refuses two ranks on one GPU)."""
    if backend != "nccl":
        return DevicePlan(torch.device("cpu"), None)
    entries = visible_devices(cuda_visible_devices)
    if device_count == 0:
        raise DeviceError(
            "backend nccl, but no CUDA device is visible to this process"
            + (f" (CUDA_VISIBLE_DEVICES={cuda_visible_devices!r})" if entries is not None else "")
            + ": give the worker container resources.limits nvidia.com/gpu (one per slot), "
            "or use backend gloo"
        )
    if local_rank < device_count:
        index = local_rank
    elif device_count == 1 and entries is not None and len(entries) == 1:
        index = 0  # the launcher gave this process a device of its own
    else:
        raise DeviceError(
            f"slot {local_rank} has no GPU of its own: {device_count} visible to the "
            f"process for at least {local_rank + 1} slots; ask for as many GPUs as slots "
            "(resources.limits nvidia.com/gpu = slotsPerWorker, or -H host:slots with slots "
            "no more than the host's GPUs)"
        )
    physical = entries[index] if entries is not None and index < len(entries) else None
    return DevicePlan(torch.device("cuda", index), index, physical)
