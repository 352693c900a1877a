"""The sync of a sharded state in a new round: which commit the round resumes from, the plan
of who sends which rows of it to whom, the transfers, and the load into the model built over
the new world.

- :func:`agree_on_commit`: every member tells where it runs and which commits it holds; the
  newest commit any member confirmed is the one (``shard_commits.choose_commit``), and
  which shard each member holds in the round (``shard_layout.plan_layout``).
- :func:`load_commit`: the shapes of that commit's tensors come from one member holding it;
  ``shard_plan.plan_reshard`` plans every tensor (shards that no member holds any more are
  :class:`ShardsLostError`), ``shard_exchange.reshard`` carries the plan out over the round's
  host group and ``shard_snapshot.load_shards`` loads this rank's new rows. No rank ever
  holds a whole tensor.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from elasticjob.worker_runtime.collectives.round_syncs import allgather_object, broadcast_object
from elasticjob.worker_runtime.diagnostics.log import get_logger
from elasticjob.worker_runtime.elastic.sharded.shard_commits import (
    Commit,
    CommitInfo,
    RankCommits,
    choose_commit,
)
from elasticjob.worker_runtime.elastic.sharded.shard_exchange import Shards, reshard
from elasticjob.worker_runtime.elastic.sharded.shard_layout import MeshLayout, plan_layout
from elasticjob.worker_runtime.elastic.sharded.shard_load import StateCopies, load_shards
from elasticjob.worker_runtime.elastic.sharded.shard_plan import (
    Key,
    LostShards,
    Transfer,
    moved_bytes,
    plan_reshard,
)
from elasticjob.worker_runtime.exceptions import HorovodInternalError

if TYPE_CHECKING:
    from elasticjob.worker_runtime.runtime import Runtime

logger = get_logger(__name__)

Chosen = tuple[int, dict[int, CommitInfo]]
"""A commit's number and what each member holding it holds of it, by rank."""


@dataclass(frozen=True)
class Loaded:
    """How a commit was loaded in a round: the seconds of the transfers and of the load, and
    the bytes the round's ranks sent one another (all of them together; 0 when nothing
    moved, as when a lost replica leaves the others as they were)."""

    reshard_s: float = 0.0
    load_s: float = 0.0
    sent_bytes: int = 0
    kept: bool = False
    """Whether this rank's new shards are its own committed ones, whole (as when a lost
    replica leaves the others as they were): the model then holds what its commit holds,
    and the new round commits that snapshot again instead of taking another."""
    copies: StateCopies = field(default_factory=lambda: StateCopies(()))
    """The copies of the commit's optimizer state still being made beside training."""


@dataclass(frozen=True)
class SyncTimes:
    """Where the last round's sync spent its time, in seconds, and the bytes its reshard
    sent between ranks."""

    exchange_s: float
    """Every rank telling which commit and which old shards it holds."""
    build_s: float
    """``build(mesh)``: the model and optimizer made and sharded over the new world."""
    reshard_s: float
    """The plan carried out: rows sent and received (0 when nothing was loaded)."""
    load_s: float
    """The new rows loaded into the model and optimizer (0 when nothing was loaded)."""
    commit_s: float
    """The new layout's snapshot (its copies move while training goes on); none is taken
    where this rank kept its shard."""
    sent_bytes: int = 0
    """What the round's ranks sent one another to reshard, all of them together."""
    kept: bool = False
    """Whether this rank kept its committed shard whole and committed it again as it was."""


class ShardsLostError(RuntimeError):
    """Committed shards that no rank of the new round holds: more ranks failed at once than
    the state's ``redundancy`` covers."""


@dataclass(frozen=True)
class NewWorld:
    """What a sync loads a commit into: the round's runtime, layout, device mesh and host
    group, and the model and optimizer built over the mesh."""

    runtime: Runtime
    layout: MeshLayout
    mesh: DeviceMesh
    host_group: dist.ProcessGroup
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    spare: Mapping[Key, torch.Tensor] = field(default_factory=dict)
    """The memory of this rank's model and optimizer in the round before, to copy its
    commit's own shards into (``shard_load.round_memory``); empty where it does not keep
    its shard."""


def keeps_shard(held: Commit | None, layout: MeshLayout, rank: int) -> bool:
    """Whether ``rank`` holds in ``layout`` the shard of its commit ``held``, whole."""
    return held is not None and (held.snapshot.shards, held.snapshot.shard) == (
        layout.shards,
        layout.shard_of(rank),
    )


@dataclass(frozen=True)
class Agreed:
    """What the members of a new round agreed on: each rank's machine, the commit the round
    resumes from (None: no member confirmed any, the job's first round or no member of the
    last one left) and the round's layout."""

    nodes: list[str]
    chosen: Chosen | None
    layout: MeshLayout


def agree_on_commit(
    runtime: Runtime, mine: RankCommits, shard_size: int | None, hsdp: bool
) -> Agreed:
    """Every member tells the machine and the host (pod) it runs on and the commits it
    holds (a collective); the round resumes from the newest commit any member confirmed,
    laid out as ``shard_size`` and ``hsdp`` say (``shard_layout.plan_layout``)."""
    infos = allgather_object((runtime.node, runtime.slot.hostname, mine))
    chosen = choose_commit({rank: commits for rank, (_, _, commits) in enumerate(infos)})
    layout = plan_layout([host for _, host, _ in infos], shard_size, hsdp)
    return Agreed([node for node, _, _ in infos], chosen, layout)


def plan_transfers(
    shapes: Mapping[Key, tuple[int, ...]],
    holding: Mapping[int, CommitInfo],
    layout: MeshLayout,
    redundancy: int,
) -> dict[Key, tuple[Transfer, ...]]:
    """The plan of every tensor of a commit whose shards the members ``holding`` hold, onto
    the new round's ``layout``. Raises :class:`ShardsLostError` naming the old shards that
    no member holds."""
    old_shards = next(iter(holding.values())).shards
    holders = {
        s: [rank for rank, info in holding.items() if s in info.held] for s in range(old_shards)
    }
    plans = plan_reshard(shapes, old_shards, holders, layout)
    if isinstance(plans, LostShards):
        raise ShardsLostError(
            f"the committed shards {list(plans.old_shards)} of {old_shards} are lost: no "
            f"member of the new round holds them or a copy (redundancy {redundancy}); keep "
            "more copies with ShardedState(redundancy=...)"
        )
    return plans


def load_commit(
    world: NewWorld, holding: dict[int, CommitInfo], held: Commit | None, redundancy: int
) -> Loaded:
    """Load the commit the members ``holding`` hold (``held``: this rank's, if it holds it)
    into ``world``, resharded."""
    slot = world.runtime.slot
    source = min(holding)
    described: tuple[dict[Key, tuple[int, ...]], dict[Key, torch.dtype], dict[Key, Any]] | None
    described = None
    if slot.rank == source and held is not None:
        sharded = held.snapshot.sharded
        described = (
            {key: entry.shape for key, entry in sharded.items()},
            {key: entry.dtype for key, entry in sharded.items()},
            held.snapshot.replicated,
        )
    shapes, dtypes, replicated = broadcast_object(described, root_rank=source)
    plans = plan_transfers(shapes, holding, world.layout, redundancy)
    shards: dict[int, Shards] = {}
    if slot.rank in holding and held is not None:
        shards = dict(held.copies)
        shards[held.snapshot.shard] = {k: e.local for k, e in held.snapshot.sharded.items()}
    started = time.monotonic()
    try:
        new = reshard(plans, shapes, dtypes, shards, world.layout, slot.rank, world.host_group)
    except HorovodInternalError as failed:
        world.runtime.group.abort(str(failed))
        raise
    resharded = time.monotonic()
    copies = load_shards(
        world.model,
        world.optimizer,
        world.mesh,
        shapes,
        new.shards,
        replicated,
        new.borrowed,
        world.spare,
    )
    sent = moved_bytes(plans, shapes, {key: dtype.itemsize for key, dtype in dtypes.items()})
    kept = keeps_shard(held, world.layout, slot.rank)
    logger.info(
        "resharded commit %d from %d shards onto %d shards in %d replica(s): %d bytes sent",
        holding[source].number,
        holding[source].shards,
        world.layout.shards,
        world.layout.replicas,
        sent,
    )
    return Loaded(resharded - started, time.monotonic() - resharded, sent, kept, copies)
