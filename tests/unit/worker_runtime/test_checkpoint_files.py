"""Checkpoints on disk: names, pruning and manifest checks (tables), and real files: a
process killed mid-write leaves the previous checkpoint loadable, a corrupt or truncated
newest one falls back to the previous one, and none loadable is an error, never a fresh
start."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from elasticjob.worker_runtime.elastic.checkpoint import load_newest
from elasticjob.worker_runtime.elastic.checkpoint_files import (
    MANIFEST,
    STATE_FILE,
    TENSORS_FILE,
    CheckpointError,
    Manifest,
    checkpoint_name,
    complete_newest_first,
    read_checkpoint,
    sequence_of,
    to_prune,
    validate_manifest,
    write_checkpoint,
)
from elasticjob.worker_runtime.elastic.snapshot import SnapshotKeeper

A, B, C = checkpoint_name(1, 10), checkpoint_name(2, 20), checkpoint_name(3, 30)


def test_names_sort_by_sequence() -> None:
    assert A == "ckpt-000001-step-000000000010"
    assert sequence_of(A) == 1 and sequence_of(f"{C}.tmp") == 3
    assert sequence_of("notes.txt") is None
    # After a resume from an older checkpoint, the next one written is the newest.
    assert complete_newest_first([A, checkpoint_name(4, 20), C, f"{B}.tmp", "x"]) == [
        checkpoint_name(4, 20),
        C,
        A,
    ]


@pytest.mark.parametrize(
    ("entries", "keep", "pruned"),
    [
        ([A, B, C], 3, []),
        ([A, B, C], 2, [A]),
        ([C, A, B], 1, [B, A]),
        ([A, f"{B}.tmp"], 2, [f"{B}.tmp"]),  # a dead writer's unfinished folder goes
        ([A, "lost+found", "notes.txt"], 1, []),  # not ours: kept
    ],
)
def test_to_prune(entries: list[str], keep: int, pruned: list[str]) -> None:
    assert to_prune(entries, keep) == pruned


def manifest(**changes: Any) -> bytes:
    base: dict[str, Any] = {
        "format": 1,
        "name": A,
        "epoch": 1,
        "step": 10,
        "round": 2,
        "written_at": 1.5,
        "files": {STATE_FILE: {"size": 5, "crc32": 7}, TENSORS_FILE: {"size": 64, "crc32": 9}},
    }
    return json.dumps(base | changes).encode()


SIZES = {STATE_FILE: 5, TENSORS_FILE: 64, MANIFEST: 300}


@pytest.mark.parametrize(
    ("raw", "sizes", "error"),
    [
        (manifest(), SIZES, None),
        (b'{"format": 1, "na', SIZES, "unreadable manifest"),
        (manifest(format=2), SIZES, "format version 2"),
        (manifest(step=-1), SIZES, "unreadable manifest"),
        (manifest(extra=1), SIZES, "unreadable manifest"),
        (manifest(files={STATE_FILE: {"size": 5, "crc32": 7}}), SIZES, "lists no tensors.bin"),
        (manifest(), {STATE_FILE: 5, MANIFEST: 300}, "tensors.bin is missing"),
        (manifest(), {**SIZES, TENSORS_FILE: 60}, "tensors.bin has 60 bytes"),
    ],
)
def test_validate_manifest(raw: bytes, sizes: dict[str, int], error: str | None) -> None:
    if error is None:
        assert isinstance(validate_manifest(raw, sizes), Manifest)
    else:
        with pytest.raises(CheckpointError, match=error):
            validate_manifest(raw, sizes)


def snapshot_of(value: Any, step: int = 0) -> SnapshotKeeper:
    keeper = SnapshotKeeper()
    keeper.capture(value, {"step": step}, lambda _t: False)
    return keeper


def write(folder: Path, value: Any, step: int) -> str:
    committed = snapshot_of(value, step).committed()
    assert committed is not None
    return write_checkpoint(folder, committed, epoch=step // 10, step=step, round_=1).name


def state(seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)
    return {
        "model": {"w": torch.randn(5, 3), "b": torch.randn(3).double(), "n": torch.tensor(7)},
        "flags": torch.tensor([True, False]),
        "bf": torch.randn(4).to(torch.bfloat16),
        "epoch": seed,
        "names": ["a", ("b", torch.arange(3))],
    }


def assert_equal(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, (dict, list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        pairs = (a.values(), b.values()) if isinstance(a, dict) else (a, b)
        items = zip(*pairs, strict=True)
        for x, y in items:
            assert_equal(x, y)
    else:
        assert a == b


def test_write_then_read_gives_back_the_snapshot(tmp_path: Path) -> None:
    name = write(tmp_path, state(1), step=10)
    assert [p.name for p in tmp_path.iterdir()] == [name]
    got_manifest, value = read_checkpoint(tmp_path / name)
    assert (got_manifest.epoch, got_manifest.step, got_manifest.round) == (1, 10, 1)
    assert_equal(value, state(1))


def load(folder: Path) -> tuple[Any, Any]:
    loaded: list[Any] = []
    report = load_newest(folder, lambda value, _manifest: loaded.append(value))
    return report, loaded[-1] if loaded else None


def test_no_checkpoint_is_a_fresh_start(tmp_path: Path) -> None:
    assert load(tmp_path / "absent") == (None, None)
    assert load(tmp_path) == (None, None)


@pytest.mark.parametrize(
    "damage",
    ["truncate", "flip a byte", "drop the manifest", "garbage manifest", "drop state.pkl"],
)
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(
    tmp_path: Path, damage: str
) -> None:
    first = write(tmp_path, state(1), step=10)
    newest = write(tmp_path, state(2), step=20)
    tensors = tmp_path / newest / TENSORS_FILE
    if damage == "truncate":
        tensors.write_bytes(tensors.read_bytes()[:-10])
    elif damage == "flip a byte":
        data = bytearray(tensors.read_bytes())
        data[3] ^= 0xFF
        tensors.write_bytes(bytes(data))
    elif damage == "drop the manifest":
        (tmp_path / newest / MANIFEST).unlink()
    elif damage == "garbage manifest":
        (tmp_path / newest / MANIFEST).write_text("{not json")
    else:
        (tmp_path / newest / STATE_FILE).unlink()
    report, value = load(tmp_path)
    assert report is not None and report.name == first and report.step == 10
    assert_equal(value, state(1))


def test_none_loadable_is_an_error_not_a_fresh_start(tmp_path: Path) -> None:
    for step in (10, 20):
        name = write(tmp_path, state(step), step=step)
        (tmp_path / name / TENSORS_FILE).write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"none of the 2 checkpoints.*refusing"):
        load(tmp_path)


def test_a_checkpoint_that_does_not_fit_falls_back(tmp_path: Path) -> None:
    first = write(tmp_path, state(1), step=10)
    write(tmp_path, state(2), step=20)

    def apply(value: Any, manifest: Manifest) -> None:
        if manifest.step == 20:
            raise CheckpointError("model.w is (5, 4) in the checkpoint")

    report = load_newest(tmp_path, apply)
    assert report is not None and report.name == first


CRASHING_WRITER = textwrap.dedent(
    """
    import sys, torch
    from pathlib import Path
    from elasticjob.worker_runtime.elastic import checkpoint_files
    from elasticjob.worker_runtime.elastic.snapshot import SnapshotKeeper

    folder = Path(sys.argv[1])
    keeper = SnapshotKeeper()
    keeper.capture({"w": torch.full((1000,), 2.0)}, {}, lambda t: False)
    real_write = checkpoint_files._write_file

    def write_then_hang(path, chunks):
        entry = real_write(path, chunks)
        if path.name == checkpoint_files.TENSORS_FILE:
            print("mid-write", flush=True)
            sys.stdin.read()  # killed here: the manifest is never written
        return entry

    checkpoint_files._write_file = write_then_hang
    checkpoint_files.write_checkpoint(folder, keeper.committed(), epoch=2, step=20, round_=1)
    """
)


def test_a_writer_killed_mid_write_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    first = write(tmp_path, state(1), step=10)
    writer = subprocess.Popen(
        [sys.executable, "-c", CRASHING_WRITER, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "mid-write"
    finally:
        writer.kill()
        writer.wait(30)
    unfinished = f"{checkpoint_name(2, 20)}.tmp"
    assert sorted(p.name for p in tmp_path.iterdir()) == [first, unfinished]
    report, value = load(tmp_path)
    assert report is not None and report.name == first
    assert_equal(value, state(1))
    # The next writer removes the dead writer's folder and numbers past it.
    third = write(tmp_path, state(3), step=30)
    assert sorted(p.name for p in tmp_path.iterdir()) == [first, third]
    assert sequence_of(third) == 3
