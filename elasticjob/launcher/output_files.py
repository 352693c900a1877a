"""What ``elasticjob-run`` writes besides its output: each rank's output in files, in
horovodrun's layout (``--output-filename``), and the job's timeline (``--timeline-filename``).

``--output-filename DIR``:

horovodrun (Gloo) writes ``DIR/rank.<rank>/stdout`` and ``DIR/rank.<rank>/stderr``, the rank
zero-padded so that the names sort in rank order. Its files are per process, named by the
rank the process started with. Here ranks change from round to round and a worker added to
a running job has no rank until it is planned into one, so each line goes to the file of the
rank its worker holds when the line is written, appended: ``rank.3/stdout`` is everything
written by rank 3, whichever process held it. Lines of a worker that holds no rank (it is
joining, or it has left the job) go to ``DIR/unranked/<host>.<slot>/``.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from elasticjob.wire.messages import WorkerId

logger = logging.getLogger(__name__)


def rank_width(np: int | None, max_np: int | None) -> int:
    """Digits of the zero-padded rank: those of the largest rank the job can have when it is
    bounded, else of ``-np`` (horovodrun pads to ``-np``); larger ranks get more digits."""
    largest = max(np or 1, max_np or 1) - 1
    return len(str(largest))


class RankOutputFiles:
    """The open files under ``directory``; lines are flushed as they are written."""

    def __init__(self, directory: Path, width: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._directory = directory
        self._width = width
        self._files: dict[Path, TextIO] = {}
        self._failed: set[Path] = set()

    def path(self, worker: WorkerId, rank: int | None, stream: str) -> Path:
        """The file of ``stream`` (``stdout``, ``stderr``) for a line of ``worker``."""
        if rank is None:
            folder = self._directory / "unranked" / f"{worker.hostname}.{worker.local_rank}"
        else:
            folder = self._directory / f"rank.{str(rank).zfill(self._width)}"
        return folder / stream

    def write(self, worker: WorkerId, rank: int | None, stream: str, line: str) -> None:
        """Append ``line`` to its file; a file that cannot be written is logged once and
        left out (the line was printed already)."""
        path = self.path(worker, rank, stream)
        if path in self._failed:
            return
        try:
            file = self._files.get(path)
            if file is None:
                path.parent.mkdir(parents=True, exist_ok=True)
                file = self._files[path] = path.open("a", encoding="utf-8")
            file.write(line)
            file.flush()
        except OSError as exc:
            logger.warning("cannot write worker output to %s: %s", path, exc)
            self._failed.add(path)

    def close(self) -> None:
        """Close every file."""
        for file in self._files.values():
            file.close()
        self._files.clear()


def write_timeline(parts: Path, destination: Path) -> None:
    """Write every worker's timeline events under ``parts`` (appended there by
    :mod:`elasticjob.worker_runtime.diagnostics.timeline`) into one Chrome-trace JSON at
    ``destination``
    (``{"traceEvents": [...]}``, one trace process per worker process, named ``host[slot]``),
    then remove ``parts``. Lines cut short by a killed worker are skipped."""
    events: list[dict[str, Any]] = []
    try:
        for path in sorted(parts.glob("*.jsonl")):
            host, slot, pid = path.name.removesuffix(".jsonl").rsplit(".", 2)
            name = {"name": f"{host}[{slot}] pid {pid}"}
            events.append({"name": "process_name", "ph": "M", "pid": int(pid), "args": name})
            events.extend(_events(path.read_text(encoding="utf-8").splitlines()))
        destination.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
        logger.info("timeline: %d events written to %s", len(events), destination)
    except OSError as exc:
        logger.error("timeline: cannot write %s: %s", destination, exc)
    finally:
        shutil.rmtree(parts, ignore_errors=True)


def _events(lines: Iterable[str]) -> Iterable[dict[str, Any]]:
    for line in lines:
        try:
            yield json.loads(line)
        except ValueError:
            continue
