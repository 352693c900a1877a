"""Moving committed shards between the ranks of a round, point to point over its group.

- :func:`exchange_copies`: at a commit, each rank sends its shards to the ranks that keep
  copies of them (``shard_plan.copy_holders``) and receives the shards it keeps a copy of:
  one message per (rank, holder) and tensor, straight from the snapshot.
- :func:`reshard`: after the world changed, each rank of the new world receives the rows of
  its new shards from the ranks that hold them (``shard_plan.plan_reshard``), in one batch of
  sends and receives for every tensor at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist

from elasticjob.worker_runtime.basics import current
from elasticjob.worker_runtime.elastic.shard_plan import RowLayout, Transfer
from elasticjob.worker_runtime.elastic.shard_snapshot import ShardedEntry
from elasticjob.worker_runtime.exceptions import HorovodInternalError

Key = tuple[str, str]
Shards = dict[Key, torch.Tensor]
"""One rank's committed shards by entry (its rows of each sharded tensor)."""


def _wait_all(works: Sequence[dist.Work]) -> None:
    """Wait for point-to-point transfers. Their failure (a peer died) breaks the round's
    group: it is aborted and :class:`HorovodInternalError` raised, as the runtime's own
    collectives do (Gloo's transfers cannot be awaited through futures)."""
    try:
        for work in works:
            work.wait()
    except (RuntimeError, dist.DistError) as exc:
        current().group.abort(f"a transfer of shards failed: {exc}")
        raise HorovodInternalError(f"a transfer of shards failed: {exc}") from exc


def shard_shape(entry: ShardedEntry, world: int, rank: int) -> tuple[int, ...]:
    """The shape of ``rank``'s shard of ``entry``'s tensor in a world of ``world``."""
    start, stop = RowLayout(entry.rows, world).span(rank)
    return (stop - start, *entry.shape[1:])


def _by_dtype(keys: Sequence[Key], entries: Mapping[Key, ShardedEntry]) -> dict[str, list[Key]]:
    grouped: dict[str, list[Key]] = {}
    for key in keys:
        grouped.setdefault(str(entries[key].dtype), []).append(key)
    return grouped


def exchange_copies(
    entries: Mapping[Key, ShardedEntry],
    world: int,
    rank: int,
    holders: Mapping[int, Sequence[int]],
) -> dict[int, Shards]:
    """Send this rank's shards (``entries``' locals) to its holders; return the shards of
    the ranks whose copies this rank keeps, by their rank.

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
                operations.append(dist.P2POp(dist.isend, local.contiguous(), holder, tag=tags[key]))
    copies: dict[int, Shards] = {}
    for owner in sorted(r for r, kept_by in holders.items() if rank in kept_by and r != rank):
        shards: Shards = {}
        for group in _by_dtype(keys, entries).values():
            shapes = [shard_shape(entries[key], world, owner) for key in group]
            counts = [int(torch.Size(shape).numel()) for shape in shapes]
            buffer = torch.empty(sum(counts), dtype=entries[group[0]].dtype)
            offset = 0
            for key, shape, count in zip(group, shapes, counts, strict=True):
                piece = buffer[offset : offset + count]
                shards[key] = piece.view(shape)
                offset += count
                if count:
                    operations.append(dist.P2POp(dist.irecv, piece, owner, tag=tags[key]))
        copies[owner] = shards
    if operations:
        _wait_all(dist.batch_isend_irecv(operations))
    return copies


def reshard(
    plans: Mapping[Key, Sequence[Transfer]],
    shapes: Mapping[Key, tuple[int, ...]],
    dtypes: Mapping[Key, torch.dtype],
    held: Mapping[int, Shards],
    new_world: int,
    rank: int,
) -> Shards:
    """Carry the transfers of every entry out (``plans``: ``shard_plan.plan_reshard``'s, by
    entry); ``held``: the old shards this rank holds, by old rank. Return this rank's new
    shards."""
    operations: list[dist.P2POp] = []
    arrivals: list[tuple[torch.Tensor, torch.Tensor]] = []
    new_shards: Shards = {}
    for key in sorted(plans):
        shape = shapes[key]
        start, stop = RowLayout(shape[0], new_world).span(rank)
        target = torch.empty((stop - start, *shape[1:]), dtype=dtypes[key])
        new_shards[key] = target
        for move in plans[key]:
            if rank not in (move.target, move.source):
                continue
            rows = slice(*move.new_rows)
            if move.source == rank:
                piece = held[move.old_rank][key][slice(*move.old_rows)]
                if move.target == rank:
                    target[rows] = piece
                else:
                    operations.append(dist.P2POp(dist.isend, piece.contiguous(), move.target))
            else:
                buffer = torch.empty_like(target[rows])
                operations.append(dist.P2POp(dist.irecv, buffer, move.source))
                arrivals.append((target[rows], buffer))
    if operations:
        _wait_all(dist.batch_isend_irecv(operations))
    for place, buffer in arrivals:
        place.copy_(buffer)
    return new_shards
