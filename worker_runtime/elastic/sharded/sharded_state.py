"""Elastic state of a model sharded with FSDP2: committed in host memory with copies on
other ranks, rebuilt and resharded onto each new world without any rank holding it whole.

A user gives :class:`ShardedState` a ``build(mesh)`` function that makes the model, applies
``fully_shard`` over ``mesh`` and makes the optimizer, as an FSDP2 script does once. The state
calls it for every round (the round's group is new), then gives the new shards the
committed state:

- ``commit()`` copies this rank's shards (parameters and optimizer state) to host memory
  (``shard_snapshot.py``) and sends them to the ``redundancy`` ranks that keep copies of
  them, on other machines (a pod's node) first (``shard_plan.copy_holders``,
  ``shard_exchange.py``); a barrier confirms it, and the previous commit is kept until
  then (``shard_commits.py``);
- after a failure or a resize, ``sync()`` asks every rank of the new round which old shards
  it holds, plans who sends which rows to whom (``shard_plan.plan_reshard``), rebuilds the
  model over the new world and loads it; newcomers get exactly their own rows. Shards that no
  rank holds any more come from the newest durable checkpoint (``shard_checkpoint.py``), or
  fail the job with a message saying which, and how to keep more copies;
- a host update (scale-out, graceful scale-in) commits first, so nothing rolls back.

Other attributes (an ``ElasticSampler``, epoch and batch counters) are kept as
:class:`~elasticjob.worker_runtime.elastic.state.TorchState` keeps them: committed, rolled
back, and synced from rank 0, which is always a member of the previous round.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from elasticjob.wire.messages import CheckpointReport
from elasticjob.worker_contract import checkpoint_from_env
from elasticjob.worker_runtime.basics import current
from elasticjob.worker_runtime.collectives.round_syncs import allgather_object, broadcast_object
from elasticjob.worker_runtime.elastic.sharded.shard_checkpoint import ShardCheckpointer
from elasticjob.worker_runtime.elastic.sharded.shard_commits import (
    Commit,
    CommitInfo,
    RankCommits,
    choose_commit,
)
from elasticjob.worker_runtime.elastic.sharded.shard_copies import CopiesInFlight, Outcome
from elasticjob.worker_runtime.elastic.sharded.shard_exchange import (
    Key,
    Shards,
    host_group,
    reshard,
)
from elasticjob.worker_runtime.elastic.sharded.shard_plan import (
    LostShards,
    copy_holders,
    plan_reshard,
)
from elasticjob.worker_runtime.elastic.sharded.shard_snapshot import (
    load_shards,
    release_group,
    take_snapshot,
)
from elasticjob.worker_runtime.elastic.state import State, TorchState
from elasticjob.worker_runtime.elastic.state_handlers import StateHandler
from elasticjob.worker_runtime.exceptions import HorovodInternalError, HostsUpdatedInterrupt

logger = logging.getLogger(__name__)

Build = Callable[[DeviceMesh], tuple[torch.nn.Module, torch.optim.Optimizer]]
"""Makes the model sharded with ``fully_shard`` over the mesh, and its optimizer."""

SETTLE_TIMEOUT_S = 10.0
"""How long a broken round waits for its last commit's copies to finish or fail (a dead
peer's transfers fail at once; a peer cut off by the network would hold them until the
collective timeout)."""


@dataclass(frozen=True)
class SyncTimes:
    """Where the last round's sync spent its time, in seconds."""

    exchange_s: float
    """Every rank telling which commit and which old shards it holds."""
    build_s: float
    """``build(mesh)``: the model and optimizer made and sharded over the new world."""
    reshard_s: float
    """The plan carried out: rows sent and received (0 when nothing was loaded)."""
    load_s: float
    """The new rows loaded into the model and optimizer (0 when nothing was loaded)."""
    commit_s: float
    """The new layout's snapshot (its copies move while training goes on)."""


class ShardsLostError(RuntimeError):
    """Committed shards that no rank of the new round holds: more ranks failed at once than
    the state's ``redundancy`` covers."""


class ShardedState(State):
    """Elastic state of an FSDP2 model and its optimizer (see the module docstring).

    ``build(mesh)`` returns ``(model, optimizer)``, the model sharded with ``fully_shard``
    over ``mesh`` (parameters may stay uninitialized, on the meta device then ``to_empty``,
    when ``state.restoring`` is true: the committed state replaces them). ``redundancy``:
    how many other ranks keep a copy of each rank's committed shards (0: none; a rank's
    failure then loses the job's state). Other keyword arguments are attributes kept as in
    a ``TorchState``. ``state.model`` and ``state.optimizer`` exist once ``elastic.run``
    started (every round makes new ones: read them through the state)."""

    def __init__(self, build: Build, *, redundancy: int = 1, **kwargs: Any) -> None:
        super().__init__()
        if redundancy < 0:
            raise ValueError(f"redundancy must be >= 0, got {redundancy}")
        self._build = build
        self.redundancy = redundancy
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.restoring = False
        """True while ``build`` runs for a round that loads committed state."""
        self._extras: dict[str, StateHandler] = {
            name: TorchState.handler_for(value) for name, value in kwargs.items()
        }
        self._commit: Commit | None = None
        """The last confirmed commit (``shard_commits.py``)."""
        self._pending: Commit | None = None
        """The newest commit, not confirmed (yet) by the round: its copies may be in flight."""
        self._in_flight: CopiesInFlight | None = None
        """The pending commit's copies and barrier, while they run (``shard_copies.py``)."""
        self._host_group: dist.ProcessGroup | None = None
        """The round's Gloo group for host memory (``shard_exchange.host_group``)."""
        self._number = 0
        """The last commit's number, the same on every member of the round."""
        self._nodes: list[str] = []
        self._checking_in_commit = False
        self.commit_seconds = 0.0
        """How long the last commit held training up (its snapshot)."""
        self.copy_seconds = 0.0
        """How long the last settled commit's copies and barrier took, beside training."""
        self.last_sync: SyncTimes | None = None
        """Where the last round's sync spent its time."""
        policy = checkpoint_from_env()
        self._checkpointer = ShardCheckpointer(policy) if policy is not None else None
        self._loaded: CheckpointReport | None = None
        self._releases = False
        """Whether the round's group drops this state's model when it is destroyed."""
        self._mesh: DeviceMesh | None = None

    def __getattr__(self, name: str) -> Any:
        extras = self.__dict__.get("_extras", {})
        if name in extras:
            return extras[name].value
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        extras = self.__dict__.get("_extras")
        if extras is not None and name in extras:
            extras[name].value = value
        else:
            super().__setattr__(name, value)

    # ---- commits -----------------------------------------------------------------------

    def commit(self) -> None:
        self._checking_in_commit = True
        try:
            super().commit()
        finally:
            self._checking_in_commit = False

    def save(self) -> None:
        """Snapshot this rank's shards and the other attributes; the copies go to the ranks
        that keep them on a thread of their own, and a barrier confirms the commit there
        (``shard_copies.py``). The previous commit's are awaited first: one is in flight at
        most. Until it is confirmed a failure rolls back to the commit before."""
        if self.model is None or self.optimizer is None or self._host_group is None:
            raise RuntimeError("a ShardedState is committed inside elastic.run only")
        self.wait_for_commit()
        started = time.monotonic()
        runtime = current()
        slot = runtime.slot
        snapshot = take_snapshot(self.model, self.optimizer, slot.size, slot.rank)
        extras = {
            name: copy.deepcopy(handler.state_dict()) for name, handler in self._extras.items()
        }
        self._pending = Commit(self._number + 1, snapshot, {}, extras, runtime.step)
        holders = copy_holders(self._nodes, self.redundancy)
        self._in_flight = CopiesInFlight(snapshot, holders, self._host_group, self._copies_failed)
        self.commit_seconds = time.monotonic() - started

    def _settle(self, timeout_s: float | None) -> None:
        """Take the outcome of the commit in flight, if any, waiting up to ``timeout_s``
        (None: as long as it takes): confirmed, it becomes the last commit; otherwise it stays
        pending, with the copies that arrived."""
        flight, self._in_flight = self._in_flight, None
        if flight is None:
            return
        outcome, copies = flight.settle(timeout_s)
        self.copy_seconds = flight.seconds
        assert self._pending is not None
        pending = dataclasses.replace(self._pending, copies=copies)
        if outcome is Outcome.CONFIRMED:
            self._commit, self._pending = pending, None
            self._number = pending.number
        else:
            self._pending = pending

    def _copies_failed(self, group: dist.ProcessGroup, reason: str) -> None:
        """A commit's copies failed (on their thread): a peer died. The round's group is
        aborted, unless that round is over (a later round's group is not this failure's)."""
        if group is self._host_group:
            current().group.abort(reason)

    def wait_for_commit(self) -> None:
        """Block until the last commit is confirmed: its copies reached the ranks that keep
        them and every rank holds it. ``commit()`` returns before (the copies move beside
        training), and until then a failure rolls back to the commit before. Raises
        :class:`HorovodInternalError` when a peer failed meanwhile (no collective: one rank
        may call it alone)."""
        self._settle(None)
        if self._pending is not None:
            raise HorovodInternalError("a commit's copies did not complete: a peer failed")

    def after_commit(self) -> None:
        """Write a durable checkpoint when the job's policy makes this commit due."""
        if self._checkpointer is not None:
            runtime = current()
            self._checkpointer.after_commit(runtime.slot.rank, runtime.step, self._write_checkpoint)

    @property
    def writes_checkpoints(self) -> bool:
        return self._checkpointer is not None

    def checkpoint(self) -> None:
        """Write the last commit as a durable checkpoint now: every rank its own shards (a
        collective: call it on every rank). Raises :class:`RuntimeError` when the job has no
        checkpoint folder."""
        if self._checkpointer is None:
            super().checkpoint()
            return
        runtime = current()
        self._write_checkpoint(self._checkpointer.next_name(runtime.slot.rank, runtime.step))

    def _write_checkpoint(self, name: str) -> None:
        assert self._checkpointer is not None
        if self.model is None or self.optimizer is None:
            raise RuntimeError("a ShardedState is checkpointed inside elastic.run only")
        self.wait_for_commit()
        assert self._commit is not None
        runtime = current()
        epoch = self._commit.extras.get("epoch", 0)
        meta = {
            "epoch": epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else 0,
            "step": self._commit.step,
            "round": runtime.round,
            "commit": self._commit.number,
        }
        report = self._checkpointer.write(
            name, runtime.slot.rank, self.model, self.optimizer, self._commit.extras, meta
        )
        if report is not None:
            runtime.reports.checkpoint(report)

    def loaded_checkpoint(self) -> CheckpointReport | None:
        """The durable checkpoint the last sync loaded, on rank 0, once."""
        loaded, self._loaded = self._loaded, None
        return loaded

    def check_host_updates(self) -> None:
        """As ``State.check_host_updates``; when hosts changed, the live state is committed
        first (unless this is a commit's own check) and confirmed, so the next round loses
        nothing."""
        try:
            super().check_host_updates()
        except HostsUpdatedInterrupt:
            if not self._checking_in_commit:
                self.save()
            self.wait_for_commit()
            raise

    def restore(self) -> None:
        """Roll the other attributes and the step count back to the last confirmed commit;
        the shards come back from a commit at the next round's sync (which may find that a
        pending one was confirmed elsewhere: then it rolls forward to it)."""
        self._settle(SETTLE_TIMEOUT_S)
        if self._commit is None:
            return
        current().step = self._commit.step
        for name, handler in self._extras.items():
            if name in self._commit.extras:
                handler.load_state_dict(copy.deepcopy(self._commit.extras[name]))

    def wants_sync(self, required: bool) -> bool:
        """Every new round reshards: its group, and perhaps its world, is new."""
        del required
        return True

    def on_reset(self) -> None:
        for handler in self._extras.values():
            handler.on_reset()
        super().on_reset()

    # ---- a new round -------------------------------------------------------------------

    def sync(self) -> None:
        """Rebuild the model over the new round's group and give it the newest commit any
        member holds, resharded; then commit it in the new layout."""
        runtime = current()
        slot = runtime.slot
        started = time.monotonic()
        self._settle(SETTLE_TIMEOUT_S)
        if not self._releases:
            runtime.group.on_destroy(self._release)
            self._releases = True
        mine = RankCommits(
            self._commit.info() if self._commit is not None else None,
            self._pending.info() if self._pending is not None else None,
        )
        infos = allgather_object((runtime.node, mine))
        self._nodes = [node for node, _ in infos]
        chosen = choose_commit({rank: commits for rank, (_, commits) in enumerate(infos)})
        newest, members = chosen if chosen is not None else (None, {})
        if self._pending is not None and self._pending.number == newest:
            self._commit = self._pending  # confirmed elsewhere: roll forward to it
            self.restore()
        self._pending = None
        mesh = self._mesh = init_device_mesh(runtime.device.type, (slot.size,))
        self._host_group = host_group()
        checkpoints = (
            self._checkpointer.complete_checkpoints(slot.rank)
            if self._checkpointer is not None
            else []
        )
        exchanged = time.monotonic()
        self.restoring = newest is not None or bool(checkpoints)
        try:
            self.model, self.optimizer = self._build(mesh)
        finally:
            self.restoring = False
        self.optimizer.register_step_post_hook(_count_step)
        built = time.monotonic()
        reshard_s = load_s = 0.0
        if newest is None:  # the job's first round, or no member of the last one is left
            self._load_checkpoint(checkpoints)
        else:
            try:
                reshard_s, load_s = self._load_commit(members, mesh)
                self._number = newest
            except ShardsLostError as lost:
                if not self._load_checkpoint(checkpoints):
                    raise ShardsLostError(
                        f"{lost}, or write durable checkpoints (a checkpoint folder): "
                        + ("the job has none" if self._checkpointer is None else "it holds none")
                    ) from None
                logger.warning("%s: training goes on from the newest durable checkpoint", lost)
        for handler in self._extras.values():
            handler.sync()
        loaded = time.monotonic()
        self.save()
        self.last_sync = SyncTimes(
            exchange_s=exchanged - started,
            build_s=built - exchanged,
            reshard_s=reshard_s,
            load_s=load_s,
            commit_s=time.monotonic() - loaded,
        )

    def _release(self) -> None:
        """The round's group is being destroyed: let go of it. Once nothing holds it, its
        teardown closes its connections, and a peer still blocked in one of FSDP2's own
        collectives on it fails at once instead of waiting out the collective timeout.
        FSDP2's modules stay reachable after a forward pass (from outside Python's
        collector), so their references to the group are cut first. The last commit's copies
        are settled first: they move over the round's host group."""
        self._settle(SETTLE_TIMEOUT_S)
        if self.model is not None:
            release_group(self.model, self._mesh)
        self.model = self.optimizer = self._mesh = self._host_group = None

    def _load_checkpoint(self, checkpoints: list[str]) -> bool:
        """Load the newest of the durable ``checkpoints`` into the model, the optimizer and
        the other attributes; return whether one was loaded."""
        assert self.model is not None and self.optimizer is not None
        if self._checkpointer is None or not checkpoints:
            return False
        runtime = current()
        templates = {name: handler.state_dict() for name, handler in self._extras.items()}
        loaded = self._checkpointer.load_newest(checkpoints, self.model, self.optimizer, templates)
        if loaded is None:
            return False
        for name, handler in self._extras.items():
            if name in loaded.extras:
                handler.load_state_dict(loaded.extras[name])
        runtime.step = loaded.meta["step"]
        self._number = loaded.meta["commit"]
        self._loaded = loaded.report if runtime.slot.rank == 0 else None
        return True

    def _load_commit(self, holding: dict[int, CommitInfo], mesh: DeviceMesh) -> tuple[float, float]:
        """Load the commit the members ``holding`` hold (this rank's confirmed one, if it is
        one of them), resharded; return the seconds of the reshard and of the load."""
        assert self.model is not None and self.optimizer is not None
        slot = current().slot
        source = min(holding)
        number, old_world = holding[source].number, holding[source].world
        holders = {
            r: [rank for rank, info in holding.items() if r in info.held] for r in range(old_world)
        }
        layout = None
        if slot.rank == source and self._commit is not None:
            sharded = self._commit.snapshot.sharded
            layout = (
                {key: entry.shape for key, entry in sharded.items()},
                {key: entry.dtype for key, entry in sharded.items()},
                self._commit.snapshot.replicated,
            )
        shapes, dtypes, replicated = broadcast_object(layout, root_rank=source)
        plans = {}
        lost: set[int] = set()
        for key, shape in shapes.items():
            plan = plan_reshard(shape[0] if shape else 0, old_world, holders, slot.size)
            if isinstance(plan, LostShards):
                lost.update(plan.old_ranks)
            else:
                plans[key] = plan
        if lost:
            raise ShardsLostError(
                f"the committed shards of ranks {sorted(lost)} of a world of {old_world} are "
                f"lost: no member of the new round holds them or a copy (redundancy "
                f"{self.redundancy}); keep more copies with ShardedState(redundancy=...)"
            )
        held: dict[int, Shards] = {}
        if slot.rank in holding and self._commit is not None:
            snapshot = self._commit.snapshot
            held = dict(self._commit.copies)
            held[snapshot.rank] = {k: e.local for k, e in snapshot.sharded.items()}
        started = time.monotonic()
        assert self._host_group is not None
        try:
            new: dict[Key, torch.Tensor] = reshard(
                plans, shapes, dtypes, held, slot.size, slot.rank, self._host_group
            )
        except HorovodInternalError as failed:
            current().group.abort(str(failed))
            raise
        resharded = time.monotonic()
        load_shards(self.model, self.optimizer, mesh, shapes, new, replicated)
        logger.info("resharded commit %d from a world of %d onto %d", number, old_world, slot.size)
        return resharded - started, time.monotonic() - resharded


def _count_step(*_: Any) -> None:
    """An optimizer step post-hook: the runtime counts the script's steps (its progress
    reports, checkpoint names and log lines carry the count)."""
    current().count_step()
