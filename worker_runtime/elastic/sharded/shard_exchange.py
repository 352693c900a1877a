"""Moving committed shards between the ranks of a round, point to point over its group.

- :func:`exchange_copies`: at a commit, each rank sends its shards to the ranks that keep
  copies of them (``shard_plan.copy_holders``) and receives the shards it keeps a copy of:
  one message per (rank, holder) and tensor, straight from the snapshot (on the commit's
  own thread: ``shard_copies.py``).
- :func:`reshard`: after the world changed, each rank of the new round receives the rows of
  its new shards from the ranks that hold them (``shard_plan.plan_reshard``), in one batch of
  sends and receives for every tensor at once. A shard a rank keeps whole is not copied.

Both move host memory over the round's host group (:func:`host_group`), a Gloo group.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from elasticjob.worker_runtime.elastic.sharded.shard_layout import MeshLayout
from elasticjob.worker_runtime.elastic.sharded.shard_plan import Key, RowLayout, Transfer
from elasticjob.worker_runtime.elastic.sharded.shard_snapshot import ShardedEntry
from elasticjob.worker_runtime.exceptions import HorovodInternalError

Shards = dict[Key, torch.Tensor]
"""One shard of a commit, by entry (its rows of each sharded tensor)."""


def wait_all(works: Sequence[dist.Work], what: str = "a transfer of shards") -> None:
    """Wait for ``works`` on a round's host group; raise :class:`HorovodInternalError` when
    they fail (a peer died). Gloo's transfers cannot be awaited through futures, so the
    runtime's abort does not cut this wait short: a dead peer's connection fails it."""
    try:
        for work in works:
            work.wait()
    except (RuntimeError, dist.DistError) as exc:
        raise HorovodInternalError(f"{what} failed: {exc}") from exc


def host_group() -> dist.ProcessGroup:
    """A Gloo group over the whole round, for moving host memory (a collective: every member
    calls it). Shards move over it whatever the round's backend: NCCL moves device memory
    only, and a commit's copies move on a thread of their own, beside the training thread's
    collectives on the round's group."""
    group: dist.ProcessGroup = dist.new_group(backend="gloo")
    return group


def shard_shape(entry: ShardedEntry, shards: int, shard: int) -> tuple[int, ...]:
    """The shape of shard ``shard`` of ``shards`` of ``entry``'s tensor."""
    start, stop = RowLayout(entry.rows, shards).span(shard)
    return (stop - start, *entry.shape[1:])


def _by_dtype(keys: Sequence[Key], entries: Mapping[Key, ShardedEntry]) -> dict[str, list[Key]]:
    grouped: dict[str, list[Key]] = {}
    for key in keys:
        grouped.setdefault(str(entries[key].dtype), []).append(key)
    return grouped


def exchange_copies(
    entries: Mapping[Key, ShardedEntry],
    layout: MeshLayout,
    rank: int,
    holders: Mapping[int, Sequence[int]],
    group: dist.ProcessGroup,
) -> dict[int, Shards]:
    """Send this rank's shards (``entries``' locals) to its holders; return the shards this
    rank keeps a copy of, by shard (of the round's ``layout``).

    Each shard goes as it is, one message per (holder, tensor) tagged by the tensor's place
    in the sorted entries, and arrives in a slice of one buffer per (owner, dtype): nothing
    is copied into a flat send buffer first (that copy cost as much as the snapshot)."""
    keys = sorted(entries)
    tags = {key: tag for tag, key in enumerate(keys)}
    operations: list[dist.P2POp] = []
    for holder in holders.get(rank, ()):
        for key in keys:
            local = entries[key].local
            if local.numel():  # nothing is sent for shards without rows
                operations.append(
                    dist.P2POp(dist.isend, local.contiguous(), holder, group, tags[key])
                )
    copies: dict[int, Shards] = {}
    for owner in sorted(r for r, kept_by in holders.items() if rank in kept_by and r != rank):
        shards: Shards = {}
        owned = layout.shard_of(owner)
        for same_dtype in _by_dtype(keys, entries).values():
            shapes = [shard_shape(entries[key], layout.shards, owned) for key in same_dtype]
            counts = [int(torch.Size(shape).numel()) for shape in shapes]
            buffer = torch.empty(sum(counts), dtype=entries[same_dtype[0]].dtype)
            offset = 0
            for key, shape, count in zip(same_dtype, shapes, counts, strict=True):
                piece = buffer[offset : offset + count]
                shards[key] = piece.view(shape)
                offset += count
                if count:
                    operations.append(dist.P2POp(dist.irecv, piece, owner, group, tags[key]))
        copies[owned] = shards  # two replicas' copies of one shard are alike: one is kept
    if operations:
        wait_all(dist.batch_isend_irecv(operations))
    return copies


@dataclass(frozen=True)
class NewShards:
    """A rank's new shards after a reshard, by entry, and the entries that are the rank's own
    old rows as they were (it keeps the same rows of them): those are not copied, so they
    are the held commit's tensors, and whoever keeps them beyond the load must copy them."""

    shards: Shards
    borrowed: frozenset[Key]


def _kept_whole(moves: Sequence[Transfer], rank: int, rows: int) -> Transfer | None:
    """The one transfer of ``moves`` that gives ``rank`` all its ``rows`` new rows from its
    own memory (None: its new shard is made of other rows, or comes from elsewhere)."""
    mine = [move for move in moves if move.target == rank]
    if len(mine) == 1 and mine[0].source == rank and mine[0].new_rows == (0, rows):
        return mine[0]
    return None


def reshard(
    plans: Mapping[Key, Sequence[Transfer]],
    shapes: Mapping[Key, tuple[int, ...]],
    dtypes: Mapping[Key, torch.dtype],
    held: Mapping[int, Shards],
    layout: MeshLayout,
    rank: int,
    group: dist.ProcessGroup,
) -> NewShards:
    """Carry the transfers of every entry out (``plans``: ``shard_plan.plan_reshard``'s, by
    entry) onto the new round's ``layout``; ``held``: the old shards this rank holds, by old
    shard. Return this rank's new shards."""
    operations: list[dist.P2POp] = []
    arrivals: list[tuple[torch.Tensor, torch.Tensor]] = []
    new_shards: Shards = {}
    borrowed: set[Key] = set()
    for key in sorted(plans):
        shape = shapes[key]
        start, stop = RowLayout(shape[0], layout.shards).span(layout.shard_of(rank))
        kept = _kept_whole(plans[key], rank, stop - start)
        if kept is not None:
            new_shards[key] = held[kept.old_shard][key][slice(*kept.old_rows)]
            borrowed.add(key)
        else:
            new_shards[key] = torch.empty((stop - start, *shape[1:]), dtype=dtypes[key])
        target = new_shards[key]
        for move in plans[key]:
            if rank not in (move.target, move.source) or move is kept:
                continue
            rows = slice(*move.new_rows)
            if move.source == rank:
                piece = held[move.old_shard][key][slice(*move.old_rows)]
                if move.target == rank:
                    target[rows] = piece
                else:
                    operations.append(
                        dist.P2POp(dist.isend, piece.contiguous(), move.target, group)
                    )
            else:
                buffer = torch.empty_like(target[rows])
                operations.append(dist.P2POp(dist.irecv, buffer, move.source, group))
                arrivals.append((target[rows], buffer))
    if operations:
        wait_all(dist.batch_isend_irecv(operations))
    for place, buffer in arrivals:
        place.copy_(buffer)
    return NewShards(new_shards, frozenset(borrowed))
