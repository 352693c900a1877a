"""Durable checkpoints: the fallback for a round that no worker of the previous one survived.

Memory comes first: a failure that leaves a survivor rolls back to the last in-memory commit
and syncs from it. Only when no survivor is left does a new round's rank 0 (a fresh process)
load the newest complete checkpoint before the state sync, so every rank starts from it.

Rank 0 writes the *committed* snapshot (see ``snapshot.py``) on a writer thread, pinned so
the next commits fill other buffers: a checkpoint costs the training thread nothing beyond
the commit it already made. A writer still busy when the next one is due makes that commit
skip it (the following commit is due instead). Files and atomicity: ``checkpoint_files.py``;
when: ``elasticjob.checkpoint_policy``.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from elasticjob.checkpoint_policy import CheckpointPolicy, checkpoint_due
from elasticjob.wire.messages import CheckpointReport
from elasticjob.worker_runtime.diagnostics.log import get_logger
from elasticjob.worker_runtime.elastic.checkpoint_files import (
    CheckpointError,
    Manifest,
    complete_newest_first,
    read_checkpoint,
    to_prune,
    write_checkpoint,
)
from elasticjob.worker_runtime.elastic.snapshot import Snapshot, SnapshotKeeper

logger = get_logger(__name__)

WRITE_DEADLINE_S: Final = 600.0
"""Longest a wait for a checkpoint being written lasts."""


class Checkpointer:
    """Writes a state's committed snapshots to ``policy.folder`` (rank 0 only) and keeps the
    newest ``policy.keep``; each completed one goes to ``report``."""

    def __init__(
        self,
        policy: CheckpointPolicy,
        keeper: SnapshotKeeper,
        report: Callable[[CheckpointReport], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.folder = Path(policy.folder)
        self._policy = policy
        self._keeper = keeper
        self._report = report
        self._clock = clock
        self._commits_since = 0
        self._last_at = clock()
        self._writer: threading.Thread | None = None
        self.last_write_failed = False
        """The latest checkpoint write failed (its error was logged)."""

    @property
    def busy(self) -> bool:
        """Whether a checkpoint is being written."""
        return self._writer is not None and self._writer.is_alive()

    def after_commit(self, rank: int) -> None:
        """A commit was made: write it if the policy says so and this is rank 0."""
        self._commits_since += 1
        if rank != 0:
            return
        if checkpoint_due(
            self._policy, self._commits_since, self._clock() - self._last_at, self.busy
        ):
            self._start()

    def write_now(self) -> None:
        """Write the committed snapshot now (after the checkpoint in progress, if any)."""
        self.wait()
        self._start()

    def wait(self) -> None:
        """Return once no checkpoint is being written (bounded by :data:`WRITE_DEADLINE_S`)."""
        writer = self._writer
        if writer is None:
            return
        writer.join(WRITE_DEADLINE_S)
        if writer.is_alive():
            raise RuntimeError(f"a checkpoint took over {WRITE_DEADLINE_S:.0f} s to write")

    def _start(self) -> None:
        snapshot = self._keeper.pin()
        if snapshot is None:
            return
        self._commits_since, self._last_at = 0, self._clock()
        self._writer = threading.Thread(
            target=self._write, args=(snapshot,), name="elasticjob-checkpoint", daemon=True
        )
        self._writer.start()

    def _write(self, snapshot: Snapshot) -> None:
        started = time.monotonic()
        try:
            snapshot.await_complete()
            meta = snapshot.meta
            written = write_checkpoint(
                self.folder,
                snapshot,
                epoch=meta.get("epoch", 0),
                step=meta.get("step", 0),
                round_=meta.get("round", 0),
            )
        except Exception:
            logger.exception(
                "writing a checkpoint to %s failed; trying at a later commit", self.folder
            )
            self.last_write_failed = True
            return
        finally:
            self._keeper.unpin(snapshot)
        self.last_write_failed = False
        seconds = time.monotonic() - started
        logger.info(
            "checkpoint %s written in %.2f s (%.1f MB, %.0f MB/s)",
            written.name,
            seconds,
            written.size_bytes / 1e6,
            written.size_bytes / 1e6 / max(seconds, 1e-9),
        )
        self._prune()
        report = CheckpointReport(
            name=written.name,
            epoch=meta.get("epoch", 0),
            step=meta.get("step", 0),
            seconds=seconds,
            size_bytes=written.size_bytes,
        )
        try:
            self._report(report)
        except Exception as exc:  # the runtime is gone (shut down): the file is what counts
            logger.warning("could not report checkpoint %s: %s", written.name, exc)

    def _prune(self) -> None:
        for entry in to_prune(os.listdir(self.folder), self._policy.keep):
            shutil.rmtree(self.folder / entry, ignore_errors=True)


def load_newest(folder: Path, apply: Callable[[Any, Manifest], None]) -> CheckpointReport | None:
    """Load the newest checkpoint in ``folder`` that is complete, intact and fits: ``apply``
    gets its contents and manifest and raises :class:`CheckpointError` if they do not fit
    the state. A bad checkpoint is logged and the previous one tried.

    Returns what was loaded, or None when there is no checkpoint at all (a job's first
    start). Raises :class:`CheckpointError` when checkpoints exist but none can be loaded:
    training never silently starts afresh."""
    names = complete_newest_first(os.listdir(folder)) if folder.is_dir() else []
    if not names:
        logger.info("no checkpoint in %s: training starts afresh", folder)
        return None
    failures = []
    for name in names:
        started = time.monotonic()
        try:
            manifest, value = read_checkpoint(folder / name)
            apply(value, manifest)
        except CheckpointError as exc:
            logger.error("checkpoint %s cannot be loaded: %s; trying the previous one", name, exc)
            failures.append(f"{name}: {exc}")
            continue
        size = sum(f.size for f in manifest.files.values())
        logger.info(
            "loaded checkpoint %s (epoch %d, step %d, round %d) in %.2f s",
            name,
            manifest.epoch,
            manifest.step,
            manifest.round,
            time.monotonic() - started,
        )
        return CheckpointReport(
            name=name,
            epoch=manifest.epoch,
            step=manifest.step,
            seconds=time.monotonic() - started,
            size_bytes=size,
        )
    raise CheckpointError(
        f"none of the {len(names)} checkpoints in {folder} can be loaded "
        f"(refusing to start afresh): {'; '.join(failures)}"
    )
