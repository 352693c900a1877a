"""The worker's timeline for ``elasticjob-run --timeline-filename``: Chrome-trace events.

Horovod writes a ``chrome://tracing`` (Perfetto) JSON of its background thread's activity.
Here each worker process records its own events in memory: rounds joined, resets, commits
and the collectives it waited on, with wall-clock timestamps in microseconds. When the
launcher asks for a timeline (:data:`~elasticjob.wire.ENV_TIMELINE_DIR`), the process appends
them as JSON lines to its own file in that folder whenever it joins a round, when many have
gathered, and when it shuts down; the launcher merges every file into one trace at the end
(:func:`elasticjob.launcher.output_files.write_timeline`). Without the variable nothing is
recorded: each hook is one ``None`` test.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from elasticjob import wire

logger = logging.getLogger(__name__)

FLUSH_EVERY = 4096
"""Events kept in memory before they are appended to the file."""


class _Recorder:
    def __init__(self, directory: Path) -> None:
        host = os.environ.get(wire.ENV_HOSTNAME, socket.gethostname())
        slot = os.environ.get(wire.ENV_LOCAL_RANK, "0")
        self.name = f"{host}[{slot}]"
        self.path = directory / f"{host}.{slot}.{os.getpid()}.jsonl"
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.failed = False

    def add(self, event: dict[str, Any]) -> None:
        event["pid"] = os.getpid()
        event["tid"] = 0
        with self.lock:
            self.events.append(event)
            full = len(self.events) >= FLUSH_EVERY
        if full:
            self.flush()

    def flush(self) -> None:
        with self.lock:
            events, self.events = self.events, []
        if not events or self.failed:
            return
        try:
            with self.path.open("a", encoding="utf-8") as file:
                file.writelines(json.dumps(e, separators=(",", ":")) + "\n" for e in events)
        except OSError as exc:
            self.failed = True
            logger.warning("timeline: cannot write %s: %s", self.path, exc)


def _recorder() -> _Recorder | None:
    directory = os.environ.get(wire.ENV_TIMELINE_DIR)
    return _Recorder(Path(directory)) if directory else None


_RECORDER = _recorder()


def now() -> int | None:
    """The time in microseconds when the timeline is on, else None (nothing to record)."""
    return time.time_ns() // 1000 if _RECORDER is not None else None


def span(name: str, started_us: int | None, cat: str = "elastic", **args: Any) -> None:
    """Record ``name`` from ``started_us`` (from :func:`now`) until now: a complete event
    (``ph: X``) of category ``cat``."""
    if _RECORDER is None or started_us is None:
        return
    duration = time.time_ns() // 1000 - started_us
    _RECORDER.add(
        {"name": name, "cat": cat, "ph": "X", "ts": started_us, "dur": duration, "args": args}
    )


def instant(name: str, cat: str = "elastic", **args: Any) -> None:
    """Record a moment (``ph: i``) of this process."""
    if _RECORDER is None:
        return
    ts = time.time_ns() // 1000
    _RECORDER.add({"name": name, "cat": cat, "ph": "i", "s": "p", "ts": ts, "args": args})


def collective_name() -> str:
    """The public function that waits on a collective (the caller's caller's name); only
    called while the timeline is on."""
    frame = sys._getframe(2)
    while frame.f_back is not None and frame.f_code.co_name.startswith("_"):
        frame = frame.f_back
    return frame.f_code.co_name


def enabled() -> bool:
    """Whether this process records a timeline."""
    return _RECORDER is not None


def flush() -> None:
    """Append the recorded events to this process's file."""
    if _RECORDER is not None:
        _RECORDER.flush()
