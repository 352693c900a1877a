"""The worker's timeline for ``elasticjob-run --timeline-filename``: Chrome-trace events.

Horovod writes a ``chrome://tracing`` (Perfetto) JSON of its background thread's activity.
Here each worker process records its own events in memory: rounds joined, resets, commits
and the collectives it waited on, with wall-clock timestamps in microseconds. When the
launcher asks for a timeline (:data:`~elasticjob.worker_contract.ENV_TIMELINE_DIR`), the
process appends them as JSON lines to its own file in that folder whenever it joins a round,
when many have gathered, and when it shuts down; the launcher merges every file into one
trace at the end (:func:`elasticjob.launcher.output_files.write_timeline`). Without the
variable nothing is recorded: each hook is one test.

A script may also record its own process's events into a Chrome-trace JSON file of its
choice, between :func:`start_file` and :func:`stop_file` (``hvd.start_timeline``).
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
from types import FrameType
from typing import Any

from elasticjob.worker_contract import ENV_HOSTNAME, ENV_LOCAL_RANK, ENV_TIMELINE_DIR

logger = logging.getLogger(__name__)

FLUSH_EVERY = 4096
"""Events kept in memory before they are appended to the file."""


class _Recorder:
    """Events appended to ``path``: JSON lines, or with ``array`` one JSON array (a complete
    Chrome trace once :meth:`close` wrote its end)."""

    def __init__(self, path: Path, *, array: bool = False) -> None:
        self.path = path
        self.array = array
        self.written = False
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.write_lock = threading.Lock()
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
        lines = [json.dumps(e, separators=(",", ":")) for e in events]
        with self.write_lock:
            if self.array:
                text = ("[\n" if not self.written else ",\n") + ",\n".join(lines)
            else:
                text = "".join(line + "\n" for line in lines)
            self._write(text)
            self.written = True

    def close(self) -> None:
        """Write what is left, and the end of the array."""
        self.flush()
        if self.array and not self.failed:
            self._write("\n]\n" if self.written else "[]\n")

    def _write(self, text: str) -> None:
        try:
            with self.path.open("a", encoding="utf-8") as file:
                file.write(text)
        except OSError as exc:
            self.failed = True
            logger.warning("timeline: cannot write %s: %s", self.path, exc)


def _recorder() -> _Recorder | None:
    directory = os.environ.get(ENV_TIMELINE_DIR)
    if not directory:
        return None
    host = os.environ.get(ENV_HOSTNAME, socket.gethostname())
    slot = os.environ.get(ENV_LOCAL_RANK, "0")
    return _Recorder(Path(directory) / f"{host}.{slot}.{os.getpid()}.jsonl")


_RECORDER = _recorder()
_started: _Recorder | None = None
"""The file of :func:`start_file`, while it records."""


def _recorders() -> list[_Recorder]:
    return [r for r in (_RECORDER, _started) if r is not None]


def now() -> int | None:
    """The time in microseconds when the timeline is on, else None (nothing to record)."""
    return time.time_ns() // 1000 if _RECORDER is not None or _started is not None else None


def span(name: str, started_us: int | None, cat: str = "elastic", **args: Any) -> None:
    """Record ``name`` from ``started_us`` (from :func:`now`) until now: a complete event
    (``ph: X``) of category ``cat``."""
    if started_us is None:
        return
    duration = time.time_ns() // 1000 - started_us
    for recorder in _recorders():
        recorder.add(
            {"name": name, "cat": cat, "ph": "X", "ts": started_us, "dur": duration, "args": args}
        )


def instant(name: str, cat: str = "elastic", **args: Any) -> None:
    """Record a moment (``ph: i``) of this process."""
    ts = time.time_ns() // 1000
    for recorder in _recorders():
        recorder.add({"name": name, "cat": cat, "ph": "i", "s": "p", "ts": ts, "args": args})


_RUNTIME = __name__.removesuffix(".diagnostics.timeline")
"""The worker runtime's package."""
_COLLECTIVES = f"{_RUNTIME}.collectives"


def collective_name() -> str:
    """The public function that waits on a collective (the caller's caller's name: not a
    private one, nor ``synchronize`` when the runtime's own blocking collective called it);
    in the collectives' package, the outermost public function of it the call came through
    (``allreduce`` a script called, not the helpers it waits in, nor autograd's frames
    between them). Only called while the timeline is on."""
    frame = sys._getframe(2)
    while frame.f_back is not None and (
        frame.f_code.co_name.startswith("_")
        or (frame.f_code.co_name == "synchronize" and _within(frame.f_back, _RUNTIME))
    ):
        frame = frame.f_back
    named: FrameType | None = frame
    while named is not None and (_within(named, _COLLECTIVES) or _within(named, "torch")):
        if _within(named, _COLLECTIVES) and not named.f_code.co_name.startswith("_"):
            frame = named
        named = named.f_back
    return frame.f_code.co_name


def _within(frame: FrameType, package: str) -> bool:
    module = str(frame.f_globals.get("__name__", ""))
    return module == package or module.startswith(f"{package}.")


def enabled() -> bool:
    """Whether this process records a timeline."""
    return bool(_recorders())


def flush() -> None:
    """Append the recorded events to this process's file(s)."""
    for recorder in _recorders():
        recorder.flush()


def start_file(path: Path) -> None:
    """Record this process's events into the Chrome-trace JSON file ``path`` (replaced),
    besides the launcher's timeline if any; a file being recorded is completed first."""
    global _started
    stop_file()
    path.unlink(missing_ok=True)
    _started = _Recorder(path, array=True)


def stop_file() -> None:
    """Complete the file of :func:`start_file` (nothing if none is recorded)."""
    global _started
    recorder, _started = _started, None
    if recorder is not None:
        recorder.close()
