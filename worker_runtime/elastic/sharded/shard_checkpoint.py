"""Durable checkpoints of a sharded state, in ``torch.distributed.checkpoint``'s format.

The fallback of :class:`~elasticjob.worker_runtime.elastic.sharded.sharded_state.ShardedState` for
what host memory cannot cover: more ranks lost at once than its copies cover, or no rank of the
previous round left. Every rank writes its own shards (``dcp.save``: no rank gathers the
model), so the job's checkpoint folder must be one that every worker sees (one host, or a
``ReadWriteMany`` volume).

``<folder>/ckpt-<seq>-step-<step>/`` (the names of ``checkpoint_files.py``, pruned the same
way) is a plain DCP checkpoint of the state dict ::

    {"model": get_model_state_dict(model),
     "optimizer": get_optimizer_state_dict(model, optimizer),
     "extras": {attribute: its state dict},   # the sampler, epoch, ...
     "meta": {"epoch": .., "step": .., "round": .., "commit": .., "optimizer_started": 1}}

A checkpoint of an optimizer that has not taken a step yet holds no optimizer state (torch's
``get_optimizer_state_dict`` would give it one by stepping it on zero gradients) but its
groups' hyperparameters, ``"optimizer_groups"``, and ``optimizer_started`` 0.

which standard tools load onto any world size (``dcp.load`` then ``set_state_dict``). It is
written as ``<name>.tmp`` and renamed by rank 0 once ``dcp.save`` returned on every rank (its
metadata written), so a folder without the suffix is complete.

A checkpoint is written at a commit the job's policy makes due (``checkpoint_policy.py``):
rank 0 decides and tells the others, since the ranks' clocks differ. The write is
synchronous: every rank writes its shards before ``commit()`` returns. It is loaded in the
state's sync, which every round runs: :class:`ShardCheckpointer` is the state's
checkpointing strategy (``checkpoint.Checkpoints``).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import torch
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from elasticjob.checkpoint_policy import CheckpointPolicy, checkpoint_due
from elasticjob.wire.messages import CheckpointReport
from elasticjob.worker_runtime.collectives.round_syncs import broadcast_object
from elasticjob.worker_runtime.diagnostics.log import get_logger
from elasticjob.worker_runtime.elastic.checkpoint_files import (
    TMP_SUFFIX,
    CheckpointError,
    checkpoint_name,
    complete_newest_first,
    epoch_of,
    sequence_of,
    to_prune,
)
from elasticjob.worker_runtime.elastic.sharded.shard_commits import Commit
from elasticjob.worker_runtime.elastic.sharded.shard_snapshot import (
    optimizer_groups,
    optimizer_started,
    set_optimizer_groups,
)

if TYPE_CHECKING:
    from elasticjob.worker_runtime.runtime import Runtime

logger = get_logger(__name__)

DCP_METADATA: Final = ".metadata"
"""The file ``dcp.save`` writes last, on its coordinator."""


Committed = Callable[[], tuple[torch.nn.Module, torch.optim.Optimizer, Commit]]
"""Gives the last commit, once confirmed, with the live model and optimizer that equal it."""


@dataclass(frozen=True)
class Loaded:
    """A checkpoint loaded into a model and optimizer: the other attributes' state dicts and
    what the checkpoint says about its commit."""

    extras: dict[str, Any]
    meta: dict[str, int]


class ShardCheckpointer:
    """Writes a sharded state's commits to ``policy.folder`` in DCP format, and loads the
    newest one (a :class:`~elasticjob.worker_runtime.elastic.checkpoint.Checkpoints`); what
    is written comes from ``committed``. Writing and loading are collectives of the round:
    every rank calls them together."""

    resume_pending = False
    """The state's sync, which every round runs, loads a checkpoint where one is needed."""

    def __init__(
        self,
        policy: CheckpointPolicy,
        committed: Committed,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.folder = Path(policy.folder)
        self._policy = policy
        self._committed = committed
        self._clock = clock
        self._commits_since = 0
        self._last_at = clock()
        self._loaded: CheckpointReport | None = None

    def start_round(self, rank: int) -> list[str]:
        """A round's sync starts (a collective): return the folder's complete checkpoints,
        newest first, as rank 0 sees them (a write's last rename is rank 0's), and take rank
        0's count of the commits since the last checkpoint. Every member then counts the
        same commits, a newcomer too (its own count would start at 0): members that disagreed
        on a checkpoint being due would wait in its collective until the timeout."""
        told = None
        if rank == 0:
            names = complete_newest_first(os.listdir(self.folder)) if self.folder.is_dir() else []
            told = (names, self._commits_since)
        listed: tuple[list[str], int] = broadcast_object(told, root_rank=0)
        names, self._commits_since = listed
        return names

    def after_commit(self, runtime: Runtime) -> None:
        """A commit was made: if the policy makes it due (rank 0 decides), every rank writes
        it."""
        rank = runtime.slot.rank
        self._commits_since += 1
        due = rank == 0 and checkpoint_due(
            self._policy, self._commits_since, self._clock() - self._last_at, False
        )
        if self._policy.interval_s > 0:  # by time: rank 0's clock decides for everyone
            due = broadcast_object(due, root_rank=0)
        elif rank != 0:  # by count: every rank counts the same commits (start_round)
            due = checkpoint_due(self._policy, self._commits_since, 0.0, False)
        if due:
            self._commits_since, self._last_at = 0, self._clock()
            self.write_now(runtime)

    def write_now(self, runtime: Runtime) -> None:
        """Write the last commit now, once confirmed: every rank its own shards (a
        collective). A write that fails is logged and tried again at a later commit."""
        name = self.next_name(runtime.slot.rank, runtime.step)
        model, optimizer, commit = self._committed()
        meta = {
            "epoch": epoch_of(commit.extras.get("epoch", 0)),
            "step": commit.step,
            "round": runtime.round,
            "commit": commit.number,
        }
        report = self.write(name, runtime.slot.rank, model, optimizer, commit.extras, meta)
        if report is not None:
            runtime.reports.checkpoint(report)

    def wait(self) -> None:
        """Nothing is written in the background: a write ends before ``commit()`` returns."""

    def for_suspension(self, runtime: Runtime) -> bool:
        """Write the last commit now; a failed write is logged, and the rank did its part."""
        self.write_now(runtime)
        return True

    def take_loaded(self) -> CheckpointReport | None:
        loaded, self._loaded = self._loaded, None
        return loaded

    def next_name(self, rank: int, step: int) -> str:
        """The name of the next checkpoint, taken at ``step``, chosen by rank 0 (a
        collective)."""
        name = None
        if rank == 0:
            self.folder.mkdir(parents=True, exist_ok=True)
            entries = os.listdir(self.folder)
            for stale in (e for e in entries if e.endswith(TMP_SUFFIX) and sequence_of(e)):
                shutil.rmtree(self.folder / stale, ignore_errors=True)
            seq = max((s for s in map(sequence_of, entries) if s is not None), default=0) + 1
            name = checkpoint_name(seq, step)
        chosen: str = broadcast_object(name, root_rank=0)
        return chosen

    def write(
        self,
        name: str,
        rank: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        extras: dict[str, Any],
        meta: dict[str, int],
    ) -> CheckpointReport | None:
        """Write the live model and optimizer (equal to the commit just made), the committed
        ``extras`` and ``meta`` as checkpoint ``name`` (a collective); rank 0 returns what it
        wrote, the others None. A write that fails on any rank is logged on every rank and
        tried again at a later commit (None)."""
        started = time.monotonic()
        tmp = self.folder / f"{name}{TMP_SUFFIX}"
        has_state = optimizer_started(optimizer)
        state: dict[str, Any] = {
            "model": get_model_state_dict(model),
            "extras": extras,
            "meta": {**meta, "optimizer_started": int(has_state)},
        }
        if has_state:
            state["optimizer"] = get_optimizer_state_dict(model, optimizer)
        else:
            state["optimizer_groups"] = optimizer_groups(optimizer)
        try:
            dcp_save(state, checkpoint_id=tmp)
        except CheckpointException:
            logger.exception("writing checkpoint %s failed; trying at a later commit", name)
            return None
        if rank != 0:
            return None
        size = _size_of(tmp)
        os.rename(tmp, self.folder / name)
        for entry in to_prune(os.listdir(self.folder), self._policy.keep):
            shutil.rmtree(self.folder / entry, ignore_errors=True)
        seconds = time.monotonic() - started
        logger.info("checkpoint %s written in %.2f s (%.1f MB)", name, seconds, size / 1e6)
        return CheckpointReport(
            name=name,
            epoch=meta["epoch"],
            step=meta["step"],
            seconds=seconds,
            size_bytes=size,
        )

    def load_newest(
        self,
        names: list[str],
        rank: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        extras: dict[str, Any],
    ) -> Loaded | None:
        """Load the newest of the complete checkpoints ``names`` (from
        :meth:`start_round`) into ``model`` and ``optimizer`` (sharded over the
        current world, whatever world wrote it) and return it, with ``extras`` (the
        attributes' current state dicts, as a template) as it holds them; rank 0 reports it
        (:meth:`take_loaded`). None: there is no checkpoint. A checkpoint that cannot be
        loaded is logged and the previous one tried; raises :class:`CheckpointError` when
        none can be: training never silently starts afresh. A collective: every rank reads
        the same folder."""
        if not names:
            return None
        failures = []
        for name in names:
            started = time.monotonic()
            try:
                loaded = _load(self.folder / name, model, optimizer, extras)
            except CheckpointError as exc:
                logger.error("checkpoint %s cannot be loaded: %s; trying an older one", name, exc)
                failures.append(f"{name}: {exc}")
                continue
            extras_, meta = loaded
            seconds = time.monotonic() - started
            logger.info(
                "loaded checkpoint %s (epoch %d, step %d) in %.2f s",
                name,
                meta["epoch"],
                meta["step"],
                seconds,
            )
            report = CheckpointReport(
                name=name,
                epoch=meta["epoch"],
                step=meta["step"],
                seconds=seconds,
                size_bytes=_size_of(self.folder / name),
            )
            self._loaded = report if rank == 0 else None
            return Loaded(extras_, meta)
        raise CheckpointError(
            f"none of the {len(names)} checkpoints in {self.folder} can be loaded "
            f"(refusing to start afresh): {'; '.join(failures)}"
        )


def _load(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, extras: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, int]]:
    if not (path / DCP_METADATA).is_file():
        raise CheckpointError(f"no {DCP_METADATA}: not a torch.distributed.checkpoint")
    meta = {"epoch": 0, "step": 0, "round": 0, "commit": 0, "optimizer_started": 1}
    try:  # the meta first: whether the checkpoint holds an optimizer state
        dcp_load(
            {"meta": meta}, checkpoint_id=path, planner=DefaultLoadPlanner(allow_partial_load=True)
        )
        started = bool(meta.pop("optimizer_started"))
        state: dict[str, Any] = {"model": get_model_state_dict(model), "extras": dict(extras)}
        if started:
            state["optimizer"] = get_optimizer_state_dict(model, optimizer)
        else:
            state["optimizer_groups"] = optimizer_groups(optimizer)
        dcp_load(state, checkpoint_id=path)
    except (CheckpointException, OSError, KeyError, ValueError) as exc:
        raise CheckpointError(f"unreadable: {type(exc).__name__}: {exc}") from exc
    set_model_state_dict(model, state["model"])
    if started:
        set_optimizer_state_dict(model, optimizer, state["optimizer"])
    else:
        set_optimizer_groups(optimizer, state["optimizer_groups"])
    return state["extras"], meta


def _size_of(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file()) if path.is_dir() else 0
