"""Durable checkpoints: the fallback for a round that no worker of the previous one survived.

Memory comes first: a failure that leaves a survivor rolls back to the last in-memory commit
and syncs from it. Only when no survivor is left does a new round's rank 0 (a fresh process)
load the newest complete checkpoint in the state sync, so every rank starts from it.

Every state has one checkpointing strategy (:class:`Checkpoints`): none without a checkpoint
folder (:class:`NoCheckpoints`), rank 0's writer thread for a replicated state
(:class:`Checkpointer`), every rank's own shards for a sharded one (``shard_checkpoint.py``).

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
from typing import TYPE_CHECKING, Any, Final, Protocol

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

if TYPE_CHECKING:
    from elasticjob.worker_runtime.runtime import Runtime

logger = get_logger(__name__)

WRITE_DEADLINE_S: Final = 600.0
"""Longest a wait for a checkpoint being written lasts."""

NO_FOLDER: Final = "no checkpoint folder configured (ELASTICJOB_CHECKPOINT_DIR)"


class Checkpoints(Protocol):
    """How a state's commits become durable checkpoints, and which one its sync loaded: the
    one checkpointing strategy of a state (``State.checkpointing``)."""

    @property
    def resume_pending(self) -> bool:
        """Whether the next sync may load a checkpoint that nothing else would (this process
        never held the job's state): ``elastic.run`` then syncs, even standalone."""

    def after_commit(self, runtime: Runtime) -> None:
        """A commit was made: write it when the job's policy makes it due."""

    def write_now(self, runtime: Runtime) -> None:
        """Write the last commit now (``State.checkpoint``); raises :class:`RuntimeError`
        without a checkpoint folder."""

    def wait(self) -> None:
        """Return once no checkpoint is being written (``elastic.run``, when the training
        function returns)."""

    def for_suspension(self, runtime: Runtime) -> bool:
        """The job is being suspended: write the last commit and wait until it is written;
        return whether this rank did its part (False: its write failed)."""

    def take_loaded(self) -> CheckpointReport | None:
        """The checkpoint the last sync loaded, on the rank that reports it, once."""


class NoCheckpoints:
    """The strategy of a job without a checkpoint folder: nothing is written or loaded (a
    suspended job then starts afresh when it resumes)."""

    resume_pending = False

    def after_commit(self, runtime: Runtime) -> None:
        """Nothing to write."""

    def write_now(self, runtime: Runtime) -> None:
        """Raises :class:`RuntimeError`: there is no folder to write to."""
        raise RuntimeError(NO_FOLDER)

    def wait(self) -> None:
        """Nothing is being written."""

    def for_suspension(self, runtime: Runtime) -> bool:
        """Nothing to write: this rank did its part."""
        return True

    def take_loaded(self) -> CheckpointReport | None:
        """Nothing was loaded."""
        return None


class Checkpointer:
    """The checkpoints of a replicated state (a :class:`Checkpoints`): rank 0 writes its
    committed snapshots to ``policy.folder`` and keeps the newest ``policy.keep``; a process
    that never held the job's state gives the newest one to ``apply`` in its first sync."""

    def __init__(
        self,
        policy: CheckpointPolicy,
        keeper: SnapshotKeeper,
        apply: Callable[[Any, Manifest], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.folder = Path(policy.folder)
        self._policy = policy
        self._keeper = keeper
        self._apply = apply
        self._clock = clock
        self._commits_since = 0
        self._last_at = clock()
        self._writer: threading.Thread | None = None
        self._fresh = True
        """This process never committed or synced the job's state."""
        self._loaded: CheckpointReport | None = None
        self.last_write_failed = False
        """The latest checkpoint write failed (its error was logged)."""

    @property
    def busy(self) -> bool:
        """Whether a checkpoint is being written."""
        return self._writer is not None and self._writer.is_alive()

    @property
    def resume_pending(self) -> bool:
        return self._fresh

    def after_commit(self, runtime: Runtime) -> None:
        """A commit was made: write it if the policy says so and this is rank 0."""
        self._fresh = False
        self._commits_since += 1
        if runtime.slot.rank != 0:
            return
        if checkpoint_due(
            self._policy, self._commits_since, self._clock() - self._last_at, self.busy
        ):
            self._start(runtime.reports.checkpoint)

    def write_now(self, runtime: Runtime) -> None:
        """On rank 0 (other ranks do nothing), write the committed snapshot now, on the writer
        thread: waits only for a checkpoint still being written."""
        if runtime.slot.rank == 0:
            self.wait()
            self._start(runtime.reports.checkpoint)

    def wait(self) -> None:
        """Return once no checkpoint is being written (bounded by :data:`WRITE_DEADLINE_S`)."""
        writer = self._writer
        if writer is None:
            return
        writer.join(WRITE_DEADLINE_S)
        if writer.is_alive():
            raise RuntimeError(f"a checkpoint took over {WRITE_DEADLINE_S:.0f} s to write")

    def for_suspension(self, runtime: Runtime) -> bool:
        self.write_now(runtime)
        self.wait()
        if self.last_write_failed:
            logger.error("the suspension's checkpoint could not be written")
        return not self.last_write_failed

    def resume(self, rank: int) -> None:
        """The state's sync starts: a process that never held the job's state loads the newest
        checkpoint on rank 0 (the sync then gives it to every rank). Raises
        :class:`CheckpointError` when checkpoints exist but none loads."""
        fresh, self._fresh = self._fresh, False
        if fresh and rank == 0:
            self._loaded = load_newest(self.folder, self._apply)

    def take_loaded(self) -> CheckpointReport | None:
        loaded, self._loaded = self._loaded, None
        return loaded

    def _start(self, report: Callable[[CheckpointReport], None]) -> None:
        snapshot = self._keeper.pin()
        if snapshot is None:
            return
        self._commits_since, self._last_at = 0, self._clock()
        self._writer = threading.Thread(
            target=self._write,
            args=(snapshot, report),
            name="elasticjob-checkpoint",
            daemon=True,
        )
        self._writer.start()

    def _write(self, snapshot: Snapshot, report: Callable[[CheckpointReport], None]) -> None:
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
        try:
            report(
                CheckpointReport(
                    name=written.name,
                    epoch=meta.get("epoch", 0),
                    step=meta.get("step", 0),
                    seconds=seconds,
                    size_bytes=written.size_bytes,
                )
            )
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
