"""The sync of a sharded state in a new round: which commit the round resumes from, the plan
of who sends which rows of it to whom, the transfers, and the load into the model built over
the new world.

- :func:`agree_on_commit`: every member tells where it runs and which commits it holds; the
  newest commit any member confirmed is the one (``shard_commits.choose_commit``).
- :func:`load_commit`: the layout of that commit's shards comes from one member holding it;
  ``shard_plan.plan_reshard`` plans each tensor (shards that no member holds any more are
  :class:`ShardsLostError`), ``shard_exchange.reshard`` carries the plan out over the round's
  host group and ``shard_snapshot.load_shards`` loads this rank's new rows. No rank ever
  holds a whole tensor.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
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
from elasticjob.worker_runtime.elastic.sharded.shard_exchange import Key, Shards, reshard
from elasticjob.worker_runtime.elastic.sharded.shard_plan import LostShards, Transfer, plan_reshard
from elasticjob.worker_runtime.elastic.sharded.shard_snapshot import load_shards
from elasticjob.worker_runtime.exceptions import HorovodInternalError

if TYPE_CHECKING:
    from elasticjob.worker_runtime.runtime import Runtime

logger = get_logger(__name__)

Chosen = tuple[int, dict[int, CommitInfo]]
"""A commit's number and what each member holding it holds of it, by rank."""


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


@dataclass(frozen=True)
class NewWorld:
    """What a sync loads a commit into: the round's runtime, device mesh and host group, and
    the model and optimizer built over the mesh."""

    runtime: Runtime
    mesh: DeviceMesh
    host_group: dist.ProcessGroup
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer


def agree_on_commit(runtime: Runtime, mine: RankCommits) -> tuple[list[str], Chosen | None]:
    """Every member tells the machine it runs on and the commits it holds (a collective);
    return each rank's machine and the commit the round resumes from (None: no member
    confirmed any, the job's first round or no member of the last one left)."""
    infos = allgather_object((runtime.node, mine))
    nodes = [node for node, _ in infos]
    return nodes, choose_commit({rank: commits for rank, (_, commits) in enumerate(infos)})


def plan_transfers(
    shapes: Mapping[Key, tuple[int, ...]],
    holding: Mapping[int, CommitInfo],
    new_world: int,
    redundancy: int,
) -> dict[Key, tuple[Transfer, ...]]:
    """The plan of every tensor of a commit whose shards the members ``holding`` hold, onto
    ``new_world`` ranks. Raises :class:`ShardsLostError` naming the old ranks whose shards
    no member holds."""
    old_world = next(iter(holding.values())).world
    holders = {
        r: [rank for rank, info in holding.items() if r in info.held] for r in range(old_world)
    }
    plans = {}
    lost: set[int] = set()
    for key, shape in shapes.items():
        plan = plan_reshard(shape[0] if shape else 0, old_world, holders, new_world)
        if isinstance(plan, LostShards):
            lost.update(plan.old_ranks)
        else:
            plans[key] = plan
    if lost:
        raise ShardsLostError(
            f"the committed shards of ranks {sorted(lost)} of a world of {old_world} are "
            f"lost: no member of the new round holds them or a copy (redundancy "
            f"{redundancy}); keep more copies with ShardedState(redundancy=...)"
        )
    return plans


def load_commit(
    world: NewWorld, holding: dict[int, CommitInfo], held: Commit | None, redundancy: int
) -> tuple[float, float]:
    """Load the commit the members ``holding`` hold (``held``: this rank's, if it holds it)
    into ``world``, resharded; return the seconds of the transfers and of the load."""
    slot = world.runtime.slot
    source = min(holding)
    layout: tuple[dict[Key, tuple[int, ...]], dict[Key, torch.dtype], dict[Key, Any]] | None
    layout = None
    if slot.rank == source and held is not None:
        sharded = held.snapshot.sharded
        layout = (
            {key: entry.shape for key, entry in sharded.items()},
            {key: entry.dtype for key, entry in sharded.items()},
            held.snapshot.replicated,
        )
    shapes, dtypes, replicated = broadcast_object(layout, root_rank=source)
    plans = plan_transfers(shapes, holding, slot.size, redundancy)
    shards: dict[int, Shards] = {}
    if slot.rank in holding and held is not None:
        shards = dict(held.copies)
        shards[held.snapshot.rank] = {k: e.local for k, e in held.snapshot.sharded.items()}
    started = time.monotonic()
    try:
        new = reshard(plans, shapes, dtypes, shards, slot.size, slot.rank, world.host_group)
    except HorovodInternalError as failed:
        world.runtime.group.abort(str(failed))
        raise
    resharded = time.monotonic()
    load_shards(world.model, world.optimizer, world.mesh, shapes, new, replicated)
    logger.info(
        "resharded commit %d from a world of %d onto %d",
        holding[source].number,
        holding[source].world,
        slot.size,
    )
    return resharded - started, time.monotonic() - resharded
