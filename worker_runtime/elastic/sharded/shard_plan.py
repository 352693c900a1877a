"""Where a sharded model's committed shards live and how they move when the world changes:
pure functions, no torch, no communication.

FSDP2 (``torch.distributed.fsdp.fully_shard``) shards every parameter, and the optimizer
state beside it, along dimension 0 as ``torch.chunk`` does: in ``n`` shards, shard ``s``
holds rows ``[s * c, (s + 1) * c)`` of a tensor of ``rows`` rows, ``c = ceil(rows / n)``,
clipped to ``rows`` (the last shards may hold fewer rows, or none): :class:`RowLayout`.
Which rank holds which shard, in each replica, is the round's ``shard_layout.MeshLayout``.

A commit keeps each rank's shards in its own host memory; every other replica holds the
same shards, and :func:`extra_copies` more copies go to other ranks, on other machines
(nodes) where the round has them (:func:`copy_holders`), so that each shard survives
``redundancy`` lost ranks. After the world changes, :func:`plan_reshard` says who sends
which rows of which old shard to whom, so that every rank of the new round gets exactly the
rows of its new shard from a rank that holds them; nobody ever needs the whole tensor. When
no rank holds an old shard any more, :class:`LostShards` names them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from elasticjob.worker_runtime.elastic.sharded.shard_layout import MeshLayout

Key = tuple[str, str]
"""An entry of a sharded state: ``("model" | "optimizer", its flat name)``."""


@dataclass(frozen=True)
class RowLayout:
    """How ``rows`` rows of a tensor are split in ``world`` shards (``torch.chunk``)."""

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
        """The rows ``[start, stop)`` of shard ``rank`` (empty past the end)."""
        if not 0 <= rank < self.world:
            raise ValueError(f"shard {rank} is not one of {self.world}")
        start = min(rank * self.chunk, self.rows)
        return start, min(start + self.chunk, self.rows)


def extra_copies(redundancy: int, replicas: int) -> int:
    """How many copies of each rank's shards a commit sends to other ranks so that a shard
    survives ``redundancy`` lost ranks, where ``replicas`` replicas hold it already (HSDP:
    with two replicas or more, none for one lost rank)."""
    return max(0, redundancy - (replicas - 1))


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
    old_shard: int
    """Which shard of the commit the rows come from."""
    old_rows: tuple[int, int]
    """The rows, as ``[start, stop)`` within that old shard."""
    new_rows: tuple[int, int]
    """Where they go, as ``[start, stop)`` within the target's new shard."""


@dataclass(frozen=True)
class LostShards:
    """Old shards that no rank of the new world holds: their committed rows are gone."""

    old_shards: tuple[int, ...]


def plan_reshard(
    shapes: Mapping[Key, tuple[int, ...]],
    old_shards: int,
    holders: Mapping[int, Sequence[int]],
    layout: MeshLayout,
) -> dict[Key, tuple[Transfer, ...]] | LostShards:
    """The transfers that give every rank of the new round (``layout``) its new shard of
    each tensor of global ``shapes``, sharded in ``old_shards`` shards in the commit;
    ``holders``: for each old shard, the ranks of the new round that hold it (the ranks of
    every replica that held it and are left, and those that kept a copy).

    A rank that holds rows itself takes them from its own memory. Otherwise one holder
    sends a target all it needs of one old shard, for every tensor alike: the least loaded
    so far, then the nearest after the target in ring order, so that the ranks of a new
    replica take their shards from several replicas where there are several. Old shards
    that hold rows the new round needs and that nobody holds are :class:`LostShards`
    (empty shards are never lost)."""
    lost: set[int] = set()
    for shape in shapes.values():
        old = RowLayout(shape[0] if shape else 0, old_shards)
        lost.update(r for r in range(old_shards) if old.span(r)[0] < old.span(r)[1])
    lost = {r for r in lost if not holders.get(r)}
    if lost:
        return LostShards(tuple(sorted(lost)))
    sources: dict[tuple[int, int], int] = {}
    loads = dict.fromkeys(range(layout.world), 0)
    plans: dict[Key, tuple[Transfer, ...]] = {}
    for key in sorted(shapes):
        shape = shapes[key]
        rows = shape[0] if shape else 0
        row_size = math.prod(shape[1:])
        old, new = RowLayout(rows, old_shards), RowLayout(rows, layout.shards)
        transfers = []
        for target in range(layout.world):
            start, stop = new.span(layout.shard_of(target))
            for old_shard in range(old_shards):
                old_start, old_stop = old.span(old_shard)
                low, high = max(start, old_start), min(stop, old_stop)
                if low >= high:
                    continue
                candidates = holders[old_shard]
                if target in candidates:
                    source = target
                else:
                    source = sources.setdefault(
                        (target, old_shard),
                        min(candidates, key=lambda r: (loads[r], (r - target) % layout.world, r)),
                    )
                    loads[source] += (high - low) * row_size
                transfers.append(
                    Transfer(
                        source,
                        target,
                        old_shard,
                        (low - old_start, high - old_start),
                        (low - start, high - start),
                    )
                )
        plans[key] = tuple(transfers)
    return plans


def moved_bytes(
    plans: Mapping[Key, Sequence[Transfer]],
    shapes: Mapping[Key, tuple[int, ...]],
    item_sizes: Mapping[Key, int],
) -> int:
    """How many bytes a plan sends from one rank to another (rows a rank takes from its own
    memory do not count); ``item_sizes``: each entry's bytes per element."""
    return sum(
        (move.new_rows[1] - move.new_rows[0]) * math.prod(shapes[key][1:]) * item_sizes[key]
        for key, moves in plans.items()
        for move in moves
        if move.source != move.target
    )
