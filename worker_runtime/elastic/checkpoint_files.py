"""A durable checkpoint on disk: one folder per checkpoint, complete or absent.

``<folder>/ckpt-<seq>-step-<step>/`` holds

- ``state.pkl``: the snapshot's skeleton (structure and non-tensor values) and where each
  tensor lies in ``tensors.bin``;
- ``tensors.bin``: the tensors' bytes, the snapshot's buffers one after the other;
- ``manifest.json``, written last: the format version, epoch, step and round, and each
  file's size and CRC32.

It is written as ``<name>.tmp``, every file and the folder fsynced, then renamed: a folder
without the suffix is complete, so a crash mid-write leaves only a ``.tmp`` folder that is
never read (and is removed by the next writer). Reading checks the manifest, the sizes and
the CRCs before anything is unpickled. ``seq`` grows with every checkpoint written, so the
newest is the one written last, also after a job resumed from an older one.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import time
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from elasticjob.worker_runtime.elastic.snapshot import Snapshot, TensorSlot, rebuild, slot_views

FORMAT_VERSION: Final = 1
MANIFEST: Final = "manifest.json"
STATE_FILE: Final = "state.pkl"
TENSORS_FILE: Final = "tensors.bin"
TMP_SUFFIX: Final = ".tmp"
CHUNK_BYTES: Final = 8 << 20
"""Bytes written or read (and checksummed) at a time."""
_NAME = re.compile(r"^ckpt-(\d{6,})-step-(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used (incomplete, corrupt, unreadable, or not this state's)."""


class FileEntry(BaseModel):
    """One file of a checkpoint as the manifest records it."""

    model_config = ConfigDict(extra="forbid", strict=True)
    size: Annotated[int, Field(ge=0)]
    crc32: Annotated[int, Field(ge=0, lt=1 << 32)]


class Manifest(BaseModel):
    """A checkpoint's ``manifest.json``."""

    model_config = ConfigDict(extra="forbid", strict=True)
    format: int
    name: str
    epoch: Annotated[int, Field(ge=0)]
    step: Annotated[int, Field(ge=0)]
    round: Annotated[int, Field(ge=0)]
    written_at: float
    files: dict[str, FileEntry]


@dataclass(frozen=True)
class Written:
    """A checkpoint just written."""

    name: str
    size_bytes: int


def epoch_of(value: object) -> int:
    """The epoch a checkpoint records for a state whose ``epoch`` attribute is ``value``: an
    ``int`` as it is, anything else (no such attribute, a flag) as 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def checkpoint_name(seq: int, step: int) -> str:
    """The folder name of the ``seq``-th checkpoint, taken at ``step``."""
    return f"ckpt-{seq:06d}-step-{step:012d}"


def sequence_of(entry: str) -> int | None:
    """The sequence number in a folder entry's name (a ``.tmp`` one's too), or None for an
    entry that is no checkpoint."""
    match = _NAME.match(entry.removesuffix(TMP_SUFFIX))
    return int(match.group(1)) if match else None


def complete_newest_first(entries: Iterable[str]) -> list[str]:
    """The complete checkpoints among a folder's entries, newest first."""
    named = [(sequence_of(e), e) for e in entries if not e.endswith(TMP_SUFFIX)]
    return [e for seq, e in sorted(((s, e) for s, e in named if s is not None), reverse=True)]


def to_prune(entries: Iterable[str], keep: int) -> list[str]:
    """The entries to delete so that the ``keep`` newest complete checkpoints remain: older
    complete ones and every unfinished ``.tmp`` folder (its writer is gone)."""
    entries = list(entries)
    stale = [e for e in entries if e.endswith(TMP_SUFFIX) and sequence_of(e) is not None]
    return stale + complete_newest_first(entries)[keep:]


def validate_manifest(raw: bytes, sizes: Mapping[str, int]) -> Manifest:
    """Parse a manifest and check it against the sizes of the files beside it.

    Raises :class:`CheckpointError` saying what is wrong."""
    try:
        manifest = Manifest.model_validate_json(raw)
    except ValidationError as exc:
        raise CheckpointError(f"unreadable manifest: {exc.errors()[0]['msg']}") from None
    if manifest.format != FORMAT_VERSION:
        raise CheckpointError(
            f"format version {manifest.format} (this runtime reads {FORMAT_VERSION})"
        )
    for required in (STATE_FILE, TENSORS_FILE):
        if required not in manifest.files:
            raise CheckpointError(f"the manifest lists no {required}")
    for name, entry in manifest.files.items():
        if name not in sizes:
            raise CheckpointError(f"{name} is missing")
        if sizes[name] != entry.size:
            raise CheckpointError(f"{name} has {sizes[name]} bytes, the manifest says {entry.size}")
    return manifest


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, chunks: Iterable[memoryview]) -> FileEntry:
    crc, size = 0, 0
    with path.open("wb") as f:
        for chunk in chunks:
            for start in range(0, len(chunk), CHUNK_BYTES):
                part = chunk[start : start + CHUNK_BYTES]
                f.write(part)
                crc = zlib.crc32(part, crc)
                size += len(part)
        f.flush()
        os.fsync(f.fileno())
    return FileEntry(size=size, crc32=crc)


def _buffer_bytes(snapshot: Snapshot) -> Iterable[memoryview]:
    for buffer in snapshot.buffers:
        host = buffer if buffer.device.type == "cpu" else buffer.cpu()
        yield host.numpy().data.cast("B")


def write_checkpoint(
    folder: Path, snapshot: Snapshot, *, epoch: int, step: int, round_: int
) -> Written:
    """Write ``snapshot`` as the next checkpoint in ``folder`` (atomically, see the module
    docstring); unfinished ``.tmp`` folders of dead writers are removed first."""
    folder.mkdir(parents=True, exist_ok=True)
    entries = os.listdir(folder)
    for stale in (e for e in entries if e.endswith(TMP_SUFFIX) and sequence_of(e) is not None):
        shutil.rmtree(folder / stale, ignore_errors=True)
    seq = max((s for s in map(sequence_of, entries) if s is not None), default=0) + 1
    name = checkpoint_name(seq, step)
    tmp = folder / f"{name}{TMP_SUFFIX}"
    tmp.mkdir()
    state = {
        "skeleton": snapshot.skeleton,
        "slots": [(str(s.dtype), s.shape, s.buffer, s.offset, s.nbytes) for s in snapshot.slots],
        "buffers": [b.numel() for b in snapshot.buffers],
    }
    files = {
        STATE_FILE: _write_file(tmp / STATE_FILE, [memoryview(pickle.dumps(state, protocol=5))]),
        TENSORS_FILE: _write_file(tmp / TENSORS_FILE, _buffer_bytes(snapshot)),
    }
    manifest = Manifest(
        format=FORMAT_VERSION,
        name=name,
        epoch=epoch,
        step=step,
        round=round_,
        written_at=time.time(),
        files=files,
    )
    _write_file(tmp / MANIFEST, [memoryview(manifest.model_dump_json(indent=1).encode())])
    _fsync_dir(tmp)
    os.rename(tmp, folder / name)
    _fsync_dir(folder)
    return Written(name, sum(f.size for f in files.values()))


def _read_checked(path: Path, entry: FileEntry, into: memoryview) -> None:
    crc, filled = 0, 0
    with path.open("rb") as f:
        while filled < entry.size:
            got = f.readinto(into[filled : filled + CHUNK_BYTES])
            if not got:
                raise CheckpointError(f"{path.name} ends after {filled} bytes")
            crc = zlib.crc32(into[filled : filled + got], crc)
            filled += got
    if crc != entry.crc32:
        raise CheckpointError(f"{path.name} fails its CRC32 check (corrupt)")


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"unknown dtype {name}")
    return dtype


def read_checkpoint(path: Path) -> tuple[Manifest, Any]:
    """A complete checkpoint's manifest and contents (tensors on the CPU, in one buffer).

    Raises :class:`CheckpointError` if it is incomplete, corrupt or unreadable."""
    try:
        sizes = {p.name: p.stat().st_size for p in path.iterdir() if p.is_file()}
        if MANIFEST not in sizes:
            raise CheckpointError("no manifest (never completed)")
        manifest = validate_manifest((path / MANIFEST).read_bytes(), sizes)
        state_entry, tensors_entry = manifest.files[STATE_FILE], manifest.files[TENSORS_FILE]
        state_bytes = bytearray(state_entry.size)
        _read_checked(path / STATE_FILE, state_entry, memoryview(state_bytes))
        data = torch.empty(tensors_entry.size, dtype=torch.uint8)
        _read_checked(path / TENSORS_FILE, tensors_entry, data.numpy().data.cast("B"))
        state = pickle.loads(state_bytes)
        sizes_of_buffers: list[int] = state["buffers"]
        if sum(sizes_of_buffers) != tensors_entry.size:
            raise CheckpointError("tensors.bin does not match the buffers state.pkl lists")
        buffers = list(torch.split(data, sizes_of_buffers)) if sizes_of_buffers else []
        slots = [
            TensorSlot(_dtype(d), tuple(shape), buffer, offset, nbytes)
            for d, shape, buffer, offset, nbytes in state["slots"]
        ]
        return manifest, rebuild(state["skeleton"], slot_views(slots, buffers))
    except CheckpointError:
        raise
    except (OSError, pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"unreadable: {type(exc).__name__}: {exc}") from exc
