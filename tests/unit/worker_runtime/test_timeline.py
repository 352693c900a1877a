"""The worker's timeline: nothing without ``ELASTICJOB_TIMELINE_DIR``; with it, Chrome-trace
events appended to the process's file, which the launcher merges into one trace."""

from __future__ import annotations

import importlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

import elasticjob.worker_runtime as hvd
from elasticjob.launcher.output_files import write_timeline
from elasticjob.worker_contract import ENV_HOSTNAME, ENV_LOCAL_RANK, ENV_TIMELINE_DIR
from elasticjob.worker_runtime.diagnostics import timeline


@pytest.fixture
def recording(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.setenv(ENV_TIMELINE_DIR, str(tmp_path / "parts"))
    monkeypatch.setenv(ENV_HOSTNAME, "127.0.1.1")
    monkeypatch.setenv(ENV_LOCAL_RANK, "1")
    (tmp_path / "parts").mkdir()
    yield importlib.reload(timeline)
    monkeypatch.delenv(ENV_TIMELINE_DIR)
    importlib.reload(timeline)


def test_without_the_variable_nothing_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_TIMELINE_DIR, raising=False)
    module = importlib.reload(timeline)
    assert not module.enabled()
    assert module.now() is None
    module.span("commit", module.now())
    module.instant("shutdown")
    module.flush()


def allreduce_(module: ModuleType) -> str:
    return _wait(module)


def _wait(module: ModuleType) -> str:
    return wait(module)


def wait(module: ModuleType) -> str:
    """Like ``RoundGroup.wait``, called by a private helper of the public function."""
    return str(module.collective_name())


def test_events_are_appended_and_merged(tmp_path: Path, recording: ModuleType) -> None:
    started = recording.now()
    assert isinstance(started, int)
    recording.span("commit", started)
    recording.span("allreduce_", started, cat="collective", failed="round broke")
    recording.flush()
    recording.instant("shutdown", round=3)
    recording.flush()
    parts = tmp_path / "parts"
    (file,) = parts.iterdir()
    assert file.name == f"127.0.1.1.1.{os.getpid()}.jsonl"
    assert len(file.read_text().splitlines()) == 3
    with file.open("a") as cut:
        cut.write('{"name": "cut sho')  # a worker killed while writing
    write_timeline(parts, tmp_path / "timeline.json")
    events = json.loads((tmp_path / "timeline.json").read_text())["traceEvents"]
    assert [e["name"] for e in events] == ["process_name", "commit", "allreduce_", "shutdown"]
    assert events[0]["args"] == {"name": f"127.0.1.1[1] pid {os.getpid()}"}
    assert events[1]["ph"] == "X" and events[1]["dur"] >= 0 and events[1]["ts"] == started
    assert events[2]["cat"] == "collective" and events[2]["args"] == {"failed": "round broke"}
    assert events[3]["ph"] == "i" and events[3]["args"] == {"round": 3}
    assert {e["pid"] for e in events} == {os.getpid()}
    assert not parts.exists()


def test_a_collective_is_named_after_the_public_function(recording: ModuleType) -> None:
    assert allreduce_(recording) == "allreduce_"


def test_many_events_are_written_before_the_end(tmp_path: Path, recording: ModuleType) -> None:
    for _ in range(recording.FLUSH_EVERY):
        recording.instant("step")
    (file,) = (tmp_path / "parts").iterdir()
    assert len(file.read_text().splitlines()) == recording.FLUSH_EVERY


def test_a_started_file_is_a_complete_chrome_trace(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    path.write_text("old")
    timeline.start_file(path)
    try:
        assert timeline.enabled()
        started = timeline.now()
        timeline.span("allreduce_", started, cat="collective")
        timeline.flush()
        timeline.instant("commit")
    finally:
        timeline.stop_file()
    events = json.loads(path.read_text())
    assert [e["name"] for e in events] == ["allreduce_", "commit"]
    assert {e["pid"] for e in events} == {os.getpid()}
    timeline.stop_file()  # stopping twice is harmless
    timeline.start_file(path)
    timeline.stop_file()
    assert json.loads(path.read_text()) == []


@pytest.mark.usefixtures("runtime_group")
def test_a_scripts_collectives_are_named_after_the_functions_it_called(tmp_path: Path) -> None:
    """Not after the helpers they wait in, autograd's frames or the runtime's own syncs."""
    path = tmp_path / "trace.json"
    hvd.start_timeline(str(path))
    try:
        hvd.allreduce(torch.ones(2))
        hvd.allreduce_(torch.ones(2))
        hvd.allgather(torch.ones(2, 1, requires_grad=True))
        hvd.synchronize(hvd.broadcast_async(torch.ones(2), root_rank=0))
        hvd.broadcast_object("tiny", root_rank=0)
    finally:
        hvd.stop_timeline()
    names = [e["name"] for e in json.loads(path.read_text()) if e["cat"] == "collective"]
    assert names == [
        "allreduce",
        "allreduce_",
        "allgather",
        "synchronize",
        "broadcast_object",  # its length
        "broadcast_object",
    ]
