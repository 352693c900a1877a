"""Snapshots of committed state in preallocated buffers, so that a commit is a memcpy.

A state's contents (nested dicts, lists and tuples of tensors and other objects) are split
into a *skeleton* (the structure, every tensor replaced by a :class:`TensorRef`, every other
leaf deep-copied) and the tensors' bytes, which are copied into one flat buffer per device.
The next commit of a state with the same tensor layout reuses a buffer: no allocation, no
page faults, only ``copy_``.

:class:`SnapshotKeeper` holds the committed snapshot. A snapshot is never written once
complete: a commit fills another buffer and then publishes it, so the committed one is
always complete, and a durable checkpoint can *pin* it and write it from another thread
while training goes on (no copy). In background mode the tensors only an optimizer step
changes (parameters, optimizer state) are copied on a copier thread while the next forward
and backward pass run; the optimizers' next ``step()`` waits for that copy (a step pre-hook),
and so do ``restore()`` and anything that reads the committed snapshot.
"""

from __future__ import annotations

import copy
import queue
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

import torch

from elasticjob.worker_runtime.diagnostics.log import get_logger

logger = get_logger(__name__)

ALIGN: Final = 64
"""Byte alignment of each tensor in its buffer (any dtype may view its slice)."""
SPARES: Final = 2
"""Free snapshots kept for the next commits: one, plus one for when a checkpoint writer
releases its pinned snapshot, so that neither commits nor checkpoints allocate (and fault
in) fresh buffers in the steady state. A state thus holds up to three copies of itself with
durable checkpoints, two without."""
COPY_DEADLINE_S: Final = 300.0
"""Longest a background copy may take before a wait for it fails."""


@dataclass(frozen=True)
class TensorRef:
    """Stands for the ``index``-th tensor of a snapshot in its skeleton."""

    index: int


@dataclass(frozen=True)
class TensorSlot:
    """Where one tensor lives in a snapshot's buffers."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    buffer: int
    """Index of the device buffer (see :attr:`Snapshot.devices`)."""
    offset: int
    nbytes: int


def _snapshottable(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.layout == torch.strided
        and not value.is_quantized
        and value.device.type != "meta"
    )


def find_tensors(value: Any) -> list[torch.Tensor]:
    """The distinct tensors in ``value``'s dicts, lists and plain tuples, in walk order."""
    found: dict[int, torch.Tensor] = {}

    def walk(item: Any) -> None:
        if _snapshottable(item):
            found.setdefault(id(item), item)
        elif isinstance(item, dict):
            for child in item.values():
                walk(child)
        elif isinstance(item, list) or type(item) is tuple:
            for child in item:
                walk(child)

    walk(value)
    return list(found.values())


def rebuild(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    """``skeleton`` with each :class:`TensorRef` replaced by its tensor (containers rebuilt)."""
    if isinstance(skeleton, TensorRef):
        return tensors[skeleton.index]
    if isinstance(skeleton, dict):
        rebuilt = copy.copy(skeleton)  # keeps attributes such as a state_dict's _metadata
        for key, child in skeleton.items():
            rebuilt[key] = rebuild(child, tensors)
        return rebuilt
    if isinstance(skeleton, list):
        return [rebuild(v, tensors) for v in skeleton]
    if type(skeleton) is tuple:
        return tuple(rebuild(v, tensors) for v in skeleton)
    return skeleton


Layout = tuple[tuple[torch.dtype, tuple[int, ...], torch.device], ...]
"""Each tensor's dtype, shape and device, in walk order."""


def plan_slots(
    tensors: Layout,
) -> tuple[tuple[TensorSlot, ...], tuple[torch.device, ...], tuple[int, ...]]:
    """Pack tensors of these dtypes, shapes and devices into one buffer per device: the
    slots, the devices and each buffer's size in bytes."""
    devices: list[torch.device] = []
    sizes: list[int] = []
    slots = []
    for dtype, shape, device in tensors:
        if device not in devices:
            devices.append(device)
            sizes.append(0)
        buffer = devices.index(device)
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        slots.append(TensorSlot(dtype, shape, buffer, sizes[buffer], nbytes))
        sizes[buffer] += -(-nbytes // ALIGN) * ALIGN
    return tuple(slots), tuple(devices), tuple(sizes)


def slot_views(slots: Iterable[TensorSlot], buffers: list[torch.Tensor]) -> list[torch.Tensor]:
    """A tensor of each slot's dtype and shape over its bytes in ``buffers``."""
    return [
        buffers[s.buffer][s.offset : s.offset + s.nbytes].view(s.dtype).view(s.shape) for s in slots
    ]


class Snapshot:
    """One copy of a state's contents: tensors in flat per-device buffers, the rest in the
    skeleton. ``meta`` holds what the snapshot's owner records with it (step, epoch...)."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.slots, self.devices, sizes = plan_slots(layout)
        self.buffers = [
            torch.empty(size, dtype=torch.uint8, device=device)
            for size, device in zip(sizes, self.devices, strict=True)
        ]
        self.tensors = slot_views(self.slots, self.buffers)
        self.skeleton: Any = None
        self.meta: dict[str, Any] = {}
        self._complete = threading.Event()
        self._error: BaseException | None = None

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data held."""
        return sum(b.numel() for b in self.buffers)

    def value(self) -> Any:
        """The snapshot's contents; its tensors are the snapshot's (copy what you keep)."""
        return rebuild(self.skeleton, self.tensors)

    def filling(self) -> None:
        """Its contents are about to be (re)written."""
        self._complete.clear()
        self._error = None

    def filled(self, error: BaseException | None = None) -> None:
        """Its contents are complete, or ``error`` stopped the copy (any thread)."""
        self._error = error
        self._complete.set()

    def await_complete(self) -> None:
        """Return once its contents are complete (any thread).

        Raises :class:`RuntimeError` if the copy failed or took over :data:`COPY_DEADLINE_S`."""
        if not self._complete.wait(COPY_DEADLINE_S):
            raise RuntimeError(f"a background commit copy took over {COPY_DEADLINE_S:.0f} s")
        if self._error is not None:
            raise RuntimeError("the background copy of a commit failed") from self._error


def layout_of(tensors: list[torch.Tensor]) -> Layout:
    """The :data:`Layout` of these tensors."""
    return tuple((t.dtype, tuple(t.shape), t.device) for t in tensors)


class _Copier:
    """A daemon thread that runs copy jobs one at a time."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="elasticjob-snapshot", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def _run(self) -> None:
        while True:
            self._jobs.get()()


class SnapshotKeeper:
    """Holds a state's committed :class:`Snapshot` (see the module docstring).

    ``background``: tensors for which ``deferrable`` is true may be copied off the calling
    thread; :meth:`wait` must be called before they change (``TorchState`` hooks its
    optimizers' ``step()``). Only the training thread captures, waits and restores; pins
    may be taken and released on any thread."""

    def __init__(self, *, background: bool = False) -> None:
        self.background = background
        self._committed: Snapshot | None = None
        self._pending: Snapshot | None = None
        self._spares: list[Snapshot] = []
        self._pins: dict[int, int] = {}
        self._lock = threading.Lock()
        self._copier: _Copier | None = None

    def capture(
        self, value: Any, meta: dict[str, Any], deferrable: Callable[[torch.Tensor], bool]
    ) -> None:
        """Copy ``value`` into a free snapshot and make it the committed one (in background
        mode, once the deferred copies are done)."""
        self.wait()
        tensors = find_tensors(value)
        snapshot = self._free_snapshot(layout_of(tensors))
        snapshot.filling()
        memo: dict[int, Any] = {id(t): TensorRef(i) for i, t in enumerate(tensors)}
        snapshot.skeleton = copy.deepcopy(value, memo)
        snapshot.meta = dict(meta)
        later: list[tuple[torch.Tensor, torch.Tensor]] = []
        with torch.no_grad():
            for dst, src in zip(snapshot.tensors, tensors, strict=True):
                if self.background and deferrable(src):
                    later.append((dst, src))
                else:
                    dst.copy_(src)
        if not later:
            snapshot.filled()
            self._publish(snapshot)
            return
        if self._copier is None:
            self._copier = _Copier()
        self._pending = snapshot
        self._copier.submit(lambda: _copy(later, snapshot))

    def wait(self) -> None:
        """Finish a background copy in flight (its snapshot becomes the committed one).

        Raises :class:`RuntimeError` if it failed (the previous commit stays committed)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.await_complete()
            self._publish(pending)

    @property
    def copying(self) -> bool:
        """Whether a background copy is in flight (cheap; for the optimizers' hooks)."""
        return self._pending is not None

    def committed(self) -> Snapshot | None:
        """The newest complete snapshot (waits for a copy in flight)."""
        self.wait()
        return self._committed

    def pin(self) -> Snapshot | None:
        """The newest snapshot, possibly still being copied (see
        :meth:`Snapshot.await_complete`), kept unchanged until :meth:`unpin`."""
        snapshot = self._pending or self._committed
        if snapshot is not None:
            with self._lock:
                self._pins[id(snapshot)] = self._pins.get(id(snapshot), 0) + 1
        return snapshot

    def unpin(self, snapshot: Snapshot) -> None:
        """Release a :meth:`pin` (any thread)."""
        with self._lock:
            left = self._pins.pop(id(snapshot)) - 1
            if left:
                self._pins[id(snapshot)] = left
            elif snapshot is not self._committed and snapshot is not self._pending:
                self._keep_spare(snapshot)

    def _free_snapshot(self, layout: Layout) -> Snapshot:
        with self._lock:
            self._spares = [s for s in self._spares if s.layout == layout]
            if self._spares:
                return self._spares.pop()
        return Snapshot(layout)

    def _keep_spare(self, snapshot: Snapshot) -> None:
        """Keep a released snapshot's buffers for the next commits (at most
        :data:`SPARES`; called under the lock)."""
        if len(self._spares) < SPARES:
            self._spares.append(snapshot)

    def _publish(self, snapshot: Snapshot) -> None:
        with self._lock:
            previous, self._committed = self._committed, snapshot
            if previous is not None and id(previous) not in self._pins:
                self._keep_spare(previous)


def _copy(pairs: list[tuple[torch.Tensor, torch.Tensor]], snapshot: Snapshot) -> None:
    try:
        with torch.no_grad():
            for dst, src in pairs:
                dst.copy_(src)
    except BaseException as exc:  # re-raised where the snapshot is awaited
        snapshot.filled(exc)
    else:
        snapshot.filled()
