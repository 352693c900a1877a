"""Elastic state of a model sharded with FSDP2: committed in host memory with copies on
other ranks, rebuilt and resharded onto each new world without any rank holding it whole.

A user gives :class:`ShardedState` a ``build(mesh)`` function that makes the model, applies
``fully_shard`` over ``mesh`` and makes the optimizer, as an FSDP2 script does once. The state
calls it for every round (the round's group is new), then gives the new shards the
committed state:

- ``commit()`` copies this rank's shards (parameters and optimizer state) to host memory
  (``shard_snapshot.py``); the commit pipeline (``shard_pipeline.py``) sends them to the
  ``redundancy`` ranks that keep copies of them, on other machines (a pod's node) first,
  and a barrier confirms the commit; the previous one is kept until then;
- after a failure or a resize, ``sync()`` (``shard_sync.py``) agrees with the new round on
  the commit it resumes from, plans who sends which rows to whom, rebuilds the model over
  the new world and loads it; newcomers get exactly their own rows. Shards that no rank
  holds any more come from the newest durable checkpoint (``shard_checkpoint.py``), or fail
  the job with a message saying which, and how to keep more copies;
- a host update (scale-out, graceful scale-in) commits first, and the round's end waits for
  that commit's copies, so nothing rolls back.

Other attributes (an ``ElasticSampler``, epoch and batch counters) are kept as
:class:`~elasticjob.worker_runtime.elastic.state.TorchState` keeps them
(``state_handlers.HandledAttributes``): committed, rolled back, and synced from rank 0, which
is always a member of the previous round.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.device_mesh import DeviceMesh

from elasticjob.wire.messages import HeldShards
from elasticjob.worker_contract import checkpoint_from_env
from elasticjob.worker_runtime.basics import current
from elasticjob.worker_runtime.diagnostics.log import get_logger
from elasticjob.worker_runtime.elastic.sharded.shard_checkpoint import ShardCheckpointer
from elasticjob.worker_runtime.elastic.sharded.shard_commits import Commit
from elasticjob.worker_runtime.elastic.sharded.shard_exchange import host_group
from elasticjob.worker_runtime.elastic.sharded.shard_layout import LayoutError, MeshLayout
from elasticjob.worker_runtime.elastic.sharded.shard_load import StateCopies, round_memory
from elasticjob.worker_runtime.elastic.sharded.shard_pipeline import CommitPipeline
from elasticjob.worker_runtime.elastic.sharded.shard_plan import Key
from elasticjob.worker_runtime.elastic.sharded.shard_snapshot import (
    ShardSnapshot,
    forget_meshes,
    release_group,
    take_snapshot,
)
from elasticjob.worker_runtime.elastic.sharded.shard_sync import (
    Chosen,
    Loaded,
    NewWorld,
    ShardsLostError,
    SyncTimes,
    agree_on_commit,
    keeps_shard,
    load_commit,
)
from elasticjob.worker_runtime.elastic.state import State
from elasticjob.worker_runtime.elastic.state_handlers import HandledAttributes
from elasticjob.worker_runtime.rounds.abortable_gloo import mesh_backends

if TYPE_CHECKING:
    from elasticjob.worker_runtime.runtime import Runtime

__all__ = ["Build", "LayoutError", "ShardedState", "ShardsLostError", "SyncTimes"]

logger = get_logger(__name__)

Build = Callable[
    [DeviceMesh],
    tuple[torch.nn.Module, torch.optim.Optimizer]
    | tuple[torch.nn.Module, torch.optim.Optimizer, Any],
]
"""Makes the model sharded with ``fully_shard`` over the mesh, and its optimizer; and, where
the script has one, the learning-rate scheduler of that optimizer."""
SCHEDULER = "scheduler"
"""The attribute under which the scheduler ``build`` returns is kept."""


class ShardedState(HandledAttributes, State):
    """Elastic state of an FSDP2 model and its optimizer (see the module docstring).

    ``build(mesh)`` returns ``(model, optimizer)``, the model sharded with ``fully_shard``
    over ``mesh`` (parameters may stay uninitialized, on the meta device then ``to_empty``,
    when ``state.restoring`` is true: the committed state replaces them), or
    ``(model, optimizer, scheduler)``: a learning-rate scheduler of that optimizer (or any
    object with ``state_dict()`` and ``load_state_dict()``), made anew with it every round
    and given the committed schedule, ``state.scheduler``. ``redundancy``:
    how many other ranks keep a copy of each rank's committed shards (0: none; a rank's
    failure then loses the job's state). ``hsdp``: ``build`` gets a two-dimensional mesh,
    (``"replicate"``, ``"shard"``), for HSDP (``fully_shard(..., mesh=mesh)`` shards over
    the second dimension and replicates over the first): each pod's ranks (its slots) shard
    the state and the pods replicate it, or each ``shard_size`` ranks where it is given
    (every world size of the job must then be a multiple of it). With two replicas or more
    every shard has a copy in another replica already: a commit sends no copies for
    ``redundancy`` 1, a lost pod moves nothing, and a new pod gets one replica's shards.
    Otherwise ``build`` gets a one-dimensional mesh of every rank (FSDP). Other keyword
    arguments are attributes kept as in a ``TorchState``. ``state.model`` and
    ``state.optimizer`` exist once ``elastic.run`` started (every round makes new ones: read
    them through the state). A rank that keeps its shard in a new round copies its commit's
    optimizer state on a thread beside the round's first forward and backward pass; the
    optimizer's step, a commit and the round's end wait for it (read the optimizer's state
    yourself only after its first step in the round)."""

    rebuilt_every_round = True

    def __init__(
        self,
        build: Build,
        *,
        redundancy: int = 1,
        hsdp: bool = False,
        shard_size: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        if redundancy < 0:
            raise ValueError(f"redundancy must be >= 0, got {redundancy}")
        if shard_size is not None and (not hsdp or shard_size < 1):
            raise ValueError(
                f"shard_size={shard_size}: a shard size is HSDP's (hsdp=True) and at least 1"
            )
        for name, value in kwargs.items():
            if name == SCHEDULER or isinstance(value, torch.optim.lr_scheduler.LRScheduler):
                raise TypeError(
                    f"ShardedState attribute {name!r}: a sharded state's optimizer is made "
                    "anew every round, so its learning-rate scheduler must be too: return "
                    "it from build(mesh) as (model, optimizer, scheduler)"
                )
        self._build = build
        self.redundancy = redundancy
        self.hsdp = hsdp
        self.shard_size = shard_size
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.restoring = False
        """True while ``build`` runs for a round that loads committed state."""
        self.register_reset_callbacks(self._keep_attributes(kwargs))
        self._pipeline = CommitPipeline(redundancy)
        self.commit_seconds = 0.0
        """How long the last commit held training up (its snapshot)."""
        self.last_sync: SyncTimes | None = None
        """Where the last round's sync spent its time."""
        policy = checkpoint_from_env()
        self._checkpointer = (
            ShardCheckpointer(policy, self._committed) if policy is not None else None
        )
        if self._checkpointer is not None:
            self.checkpointing = self._checkpointer
        self._releases = False
        """Whether the round's group drops this state's model when it is destroyed."""
        self._mesh: DeviceMesh | None = None
        self._copies = StateCopies(())
        """The last load's copies of its commit's optimizer state, made beside training."""
        self._spare: dict[Key, torch.Tensor] = {}
        """The memory of the round that ended (its model's shards and its optimizer's
        state), until the next sync loads a commit into it."""

    @property
    def layout(self) -> MeshLayout | None:
        """Which shard each rank of the round holds, in which replica (None: before
        ``elastic.run`` started)."""
        return self._pipeline.layout

    @property
    def state_copy_wait_s(self) -> float:
        """How long training waited for the last load's copies of its commit's optimizer
        state, made beside the round's first forward and backward pass (a rank that kept
        its shard copies them; 0 until the optimizer first stepped)."""
        return self._copies.waited_s

    @property
    def copy_seconds(self) -> float:
        """How long the last settled commit's copies and barrier took, beside training."""
        return self._pipeline.copy_seconds

    # ---- commits -----------------------------------------------------------------------

    def save(self) -> None:
        """Snapshot this rank's shards and the other attributes; the copies go to the ranks
        that keep them on a thread of their own, and a barrier confirms the commit there
        (``shard_pipeline.py``). The previous commit's are awaited first: one is in flight at
        most. Until it is confirmed a failure rolls back to the commit before."""
        self._commit(None)

    def _commit(self, snapshot: ShardSnapshot | None) -> None:
        """Commit ``snapshot``, a snapshot of the live state already taken, or (None) a new
        one."""
        runtime, layout = self._pipeline.runtime, self._pipeline.layout
        if self.model is None or self.optimizer is None or runtime is None or layout is None:
            raise RuntimeError("a ShardedState is committed inside elastic.run only")
        told = self._held_shards()
        self._pipeline.wait()
        if self._held_shards() != told:  # the round's first commit is confirmed
            runtime.held_shards_changed()
        started = time.monotonic()
        if snapshot is None:
            self._copies.wait()
            shard = layout.shard_of(runtime.slot.rank)
            snapshot = take_snapshot(self.model, self.optimizer, layout.shards, shard)
        self._pipeline.commit(snapshot, copy.deepcopy(self._attribute_states()))
        self.commit_seconds = time.monotonic() - started

    def wait_for_commit(self) -> None:
        """Block until the last commit is confirmed: its copies reached the ranks that keep
        them and every rank holds it. ``commit()`` returns before (the copies move beside
        training), and until then a failure rolls back to the commit before. Raises
        :class:`HorovodInternalError` when a peer failed meanwhile (no collective: one rank
        may call it alone)."""
        self._pipeline.wait()

    def _committed(self) -> tuple[torch.nn.Module, torch.optim.Optimizer, Commit]:
        """The last commit, once confirmed, and the live model and optimizer (what a durable
        checkpoint writes)."""
        if self.model is None or self.optimizer is None:
            raise RuntimeError("a ShardedState is checkpointed inside elastic.run only")
        commit = self._pipeline.wait()
        assert commit is not None
        self._copies.wait()
        return self.model, self.optimizer, commit

    def restore(self) -> None:
        """End the round (a failure) and roll the other attributes and the step count back
        to the last confirmed commit; the shards come back from a commit at the next round's
        sync (which may find that a pending one was confirmed elsewhere: then it rolls
        forward to it)."""
        self._pipeline.end_round(broken=True)
        self._roll_back_to(self._pipeline.runtime, self._pipeline.confirmed)

    def _roll_back_to(self, runtime: Runtime | None, commit: Commit | None) -> None:
        """Set the other attributes and the step count to ``commit``'s (None: nothing)."""
        if runtime is None or commit is None:
            return
        runtime.step = commit.step
        self._load_attributes(copy.deepcopy(commit.extras))

    def _held_shards(self) -> HeldShards | None:
        """What this rank holds of its last confirmed commit, copies included (None:
        nothing), for the driver to place the next round's ranks by and to plan what follows
        a lost slot."""
        commit = self._pipeline.confirmed
        if commit is None:
            return None
        own = commit.snapshot.shard
        copies = tuple(s for s in commit.copies if s != own)  # HSDP: a counterpart's copy
        return HeldShards(shards=commit.snapshot.shards, own=own, copies=copies, hsdp=self.hsdp)

    # ---- a new round -------------------------------------------------------------------

    def sync(self) -> None:
        """Rebuild the model over the new round's group and give it the newest commit any
        member holds, resharded; then commit it in the new layout (a rank that kept its
        shard commits its snapshot again: no copy)."""
        runtime = current()
        started = time.monotonic()
        if not self._releases:
            runtime.group.on_destroy(self._release)
            self._releases = True
        runtime.tell_held_shards(self._held_shards)
        agreed = agree_on_commit(runtime, self._pipeline.holdings(), self.shard_size, self.hsdp)
        chosen, layout = agreed.chosen, agreed.layout
        number = chosen[0] if chosen is not None else 0
        held = self._pipeline.held(number) if chosen is not None else None
        self._pipeline.resume(number, held)
        self._roll_back_to(runtime, held)  # forward, where the commit was pending here
        spare, self._spare = self._spare, {}
        if not keeps_shard(held, layout, runtime.slot.rank):
            spare = {}  # other shapes: let the memory go before the new model takes its own
        forget_meshes()
        names = layout.mesh_dim_names()
        mesh = self._mesh = DeviceMesh(
            runtime.device.type,
            layout.mesh_ranks(),
            mesh_dim_names=names,
            backend_override=mesh_backends(runtime.group, len(names)),
        )
        host = host_group()
        self._pipeline.start_round(runtime, host, agreed.nodes, layout)
        checkpoints = (
            self._checkpointer.start_round(runtime.slot.rank)
            if self._checkpointer is not None
            else []
        )
        exchanged = time.monotonic()
        self.restoring = chosen is not None or bool(checkpoints)
        try:
            model, optimizer, *scheduler = self._build(mesh)
        finally:
            self.restoring = False
        self.model, self.optimizer = model, optimizer
        if scheduler:
            self._keep_scheduler(scheduler[0], held)
        built = time.monotonic()
        world = NewWorld(runtime, layout, mesh, host, model, optimizer, spare)
        loaded_commit = self._load(world, chosen, held, checkpoints)
        # Counted from here: loading a commit may step the fresh optimizer on zero
        # gradients (torch's way of giving it a state to load into), which is not training.
        optimizer.register_step_post_hook(lambda *_: runtime.count_step())
        self._copies = loaded_commit.copies
        optimizer.register_step_pre_hook(lambda *_: self._copies.wait())
        self._sync_attributes()
        loaded = time.monotonic()
        # A rank that kept its shard holds its commit's state: that snapshot is committed in
        # the new round as it is (no copy of the state).
        self._commit(held.snapshot if loaded_commit.kept and held is not None else None)
        # Started once the sync is done: earlier, they would slow the other ranks' loads.
        self._copies.start()
        self.last_sync = SyncTimes(
            exchange_s=exchanged - started,
            build_s=built - exchanged,
            reshard_s=loaded_commit.reshard_s,
            load_s=loaded_commit.load_s,
            commit_s=time.monotonic() - loaded,
            sent_bytes=loaded_commit.sent_bytes,
            kept=loaded_commit.kept,
        )

    def _keep_scheduler(self, scheduler: Any, held: Commit | None) -> None:
        """Keep the round's new ``scheduler`` as the ``scheduler`` attribute, with the
        schedule of ``held`` (this rank's commit, if it holds one; a newcomer's comes from
        rank 0 in the sync of the attributes)."""
        handler = self.handler_for(scheduler)
        handler.check(SCHEDULER)
        self._handlers[SCHEDULER] = handler
        if held is not None and SCHEDULER in held.extras:
            handler.load_state_dict(held.extras[SCHEDULER])

    def _load(
        self, world: NewWorld, chosen: Chosen | None, held: Commit | None, checkpoints: list[str]
    ) -> Loaded:
        """Load the ``chosen`` commit (``held``: this rank's) into ``world``, or the newest of
        the durable ``checkpoints`` where there is none or its shards are lost (nothing is
        timed then)."""
        if chosen is None:  # the job's first round, or no member of the last one is left
            self._load_checkpoint(world, checkpoints)
            return Loaded()
        try:
            return load_commit(world, chosen[1], held, self.redundancy)
        except ShardsLostError as lost:
            if not self._load_checkpoint(world, checkpoints):
                raise ShardsLostError(
                    f"{lost}, or write durable checkpoints (a checkpoint folder): "
                    + ("the job has none" if self._checkpointer is None else "it holds none")
                ) from None
            logger.warning("%s: training goes on from the newest durable checkpoint", lost)
            return Loaded()

    def _load_checkpoint(self, world: NewWorld, checkpoints: list[str]) -> bool:
        """Load the newest of the durable ``checkpoints`` into the model, the optimizer and
        the other attributes, with its step count, and resume the commits from its number;
        return whether one was loaded."""
        if self._checkpointer is None or not checkpoints:
            return False
        runtime = world.runtime
        loaded = self._checkpointer.load_newest(
            checkpoints, runtime.slot.rank, world.model, world.optimizer, self._attribute_states()
        )
        if loaded is None:
            return False
        self._load_attributes(loaded.extras)
        runtime.step = loaded.meta["step"]
        self._pipeline.resume(loaded.meta["commit"], None)
        return True

    def _release(self) -> None:
        """The round's group is being destroyed: the round ends, and the state lets go of
        the group. Once nothing holds it, its teardown closes its connections, and a peer
        still blocked in one of FSDP2's own collectives on it fails at once instead of
        waiting out the collective timeout. FSDP2's modules stay reachable after a forward
        pass (from outside Python's collector), so their references to the group are cut
        first. The last commit's copies are settled first: they move over the round's host
        group."""
        runtime: Runtime | None = self._pipeline.runtime
        broken = runtime is None or runtime.group.errored() is not None
        self._pipeline.end_round(broken=broken)
        self._copies.wait()
        if self.model is not None:
            release_group(self.model, self._mesh)
            if self.optimizer is not None:
                self._spare = round_memory(self.model, self.optimizer)
        self.model = self.optimizer = self._mesh = None
