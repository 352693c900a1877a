"""Where a sharded model's committed shards live and how they move when the world changes:
pure functions, no torch, no communication.

FSDP2 (``torch.distributed.fsdp.fully_shard``) shards every parameter, and the optimizer
state beside it, along dimension 0 as ``torch.chunk`` does: with ``n`` ranks, rank ``r``
holds rows ``[r * c, (r + 1) * c)`` of a tensor of ``rows`` rows, ``c = ceil(rows / n)``,
clipped to ``rows`` (the last ranks may hold fewer rows, or none): :class:`RowLayout`.

A commit keeps each rank's shards in its own host memory and ``redundancy`` copies on other
ranks, on other machines (nodes) where the round has them (:func:`copy_holders`). After the world
changes, :func:`plan_reshard` says who sends which rows of which old shard to whom, so that
every rank of the new world gets exactly the rows of its new shard from a rank that holds
them; nobody ever needs the whole tensor. When no rank holds an old shard any more,
:class:`LostShards` names them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RowLayout:
    """How ``rows`` rows of a tensor are split over ``world`` ranks (``torch.chunk``)."""

    rows: int
    world: int

    def __post_init__(self) -> None:
        if self.rows < 0 or self.world < 1:
            raise ValueError(f"a layout needs rows >= 0 and world >= 1, got {self}")

    @property
    def chunk(self) -> int:
        """The rows of a full shard."""
        return -(-self.rows // self.world)

    def span(self, rank: int) -> tuple[int, int]:
        """The rows ``[start, stop)`` rank ``rank`` holds (empty past the end)."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} is not in a world of {self.world}")
        start = min(rank * self.chunk, self.rows)
        return start, min(start + self.chunk, self.rows)


def copy_holders(nodes: Sequence[str], redundancy: int) -> dict[int, tuple[int, ...]]:
    """For each rank of a round whose ranks run on the machines ``nodes`` (by rank; a pod's
    node, not the pod: the pods of a node die with it), the ranks that keep a copy of its
    committed shards: the next ``redundancy`` ranks after it, in ring order, that run on
    another node; where too few do, the next ones on the same node (a copy in another process
    survives that process's death, not its node's). The ``i``-th rank of a node starts ``i``
    places further along the other nodes' ranks, so that node-mates do not all give their
    copies to the same rank: every rank keeps about as many copies as it gives."""
    if redundancy < 0:
        raise ValueError(f"redundancy must be >= 0, got {redundancy}")
    world = len(nodes)
    holders: dict[int, tuple[int, ...]] = {}
    for rank in range(world):
        ring = [(rank + step) % world for step in range(1, world)]
        elsewhere = [r for r in ring if nodes[r] != nodes[rank]]
        if elsewhere:
            place = [r for r in range(world) if nodes[r] == nodes[rank]].index(rank)
            start = place % len(elsewhere)
            elsewhere = elsewhere[start:] + elsewhere[:start]
        nearby = [r for r in ring if nodes[r] == nodes[rank]]
        holders[rank] = tuple((elsewhere + nearby)[:redundancy])
    return holders


@dataclass(frozen=True)
class Transfer:
    """Rows of one old shard that ``source`` sends to ``target`` (ranks of the new world;
    the same rank: a copy in its own memory)."""

    source: int
    target: int
    old_rank: int
    """Whose shard of the old world the rows come from."""
    old_rows: tuple[int, int]
    """The rows, as ``[start, stop)`` within that old shard."""
    new_rows: tuple[int, int]
    """Where they go, as ``[start, stop)`` within the target's new shard."""


@dataclass(frozen=True)
class LostShards:
    """Old shards that no rank of the new world holds: their committed rows are gone."""

    old_ranks: tuple[int, ...]


def plan_reshard(
    rows: int,
    old_world: int,
    holders: Mapping[int, Sequence[int]],
    new_world: int,
) -> tuple[Transfer, ...] | LostShards:
    """The transfers that give every rank of ``new_world`` its new shard of a tensor of
    ``rows`` rows sharded over ``old_world`` ranks before; ``holders``: for each old rank,
    the ranks of the new world that hold its committed shard (its own process, if it
    survived, and those that kept a copy).

    A rank that holds rows itself takes them from its own memory; otherwise the holder is
    chosen by ring distance to the target, the same for every tensor, so that one pair of
    ranks carries all of a shard's rows together. Old shards that hold rows the new world
    needs and that nobody holds are :class:`LostShards` (empty shards are never lost)."""
    old, new = RowLayout(rows, old_world), RowLayout(rows, new_world)
    lost = sorted(
        r for r in range(old_world) if old.span(r)[0] < old.span(r)[1] and not holders.get(r)
    )
    if lost:
        return LostShards(tuple(lost))
    transfers = []
    for target in range(new_world):
        start, stop = new.span(target)
        for old_rank in range(old_world):
            old_start, old_stop = old.span(old_rank)
            low, high = max(start, old_start), min(stop, old_stop)
            if low >= high:
                continue
            candidates = holders[old_rank]
            if target in candidates:
                source = target
            else:
                source = min(candidates, key=lambda r: ((r - target) % new_world, r))
            transfers.append(
                Transfer(
                    source,
                    target,
                    old_rank,
                    (low - old_start, high - old_start),
                    (low - start, high - start),
                )
            )
    return tuple(transfers)
