"""Where each rank of a round sits on a sharded state's device mesh: pure functions, no torch,
no communication.

FSDP2 over a one-dimensional mesh shards every tensor over the whole round: one *replica*
whose shard count is the world. HSDP (FSDP2 over a two-dimensional mesh, replicate x shard)
shards within each replica and replicates across them: by default a replica is a pod (its
slots shard the state, its pods replicate it), or a given number of ranks.

:class:`MeshLayout` is the grid of a round's ranks, ``grid[replica][shard]``: which shard of
the state each rank holds; :func:`plan_layout` makes it for a round. A replica's ranks hold
its shards in rank order, and each shard's ranks across the replicas come in rank order
too: torch's process groups order their members by rank, and FSDP2 places shards in that
order (a mesh in any other order would not shard as it says). A pod that stays keeps its
ranks' order, so its ranks keep their shards while the shard size stays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

REPLICATE, SHARD = "replicate", "shard"
"""The names of an HSDP mesh's dimensions (torchtitan's ``dp_replicate`` and ``dp_shard``)."""


class LayoutError(ValueError):
    """The round's ranks cannot be laid out as the state asks (its shard size)."""


@dataclass(frozen=True)
class MeshLayout:
    """The ranks of a round on a sharded state's mesh: ``grid[replica][shard]`` is the rank
    holding that shard in that replica; ``hsdp``: a two-dimensional mesh (replicate x
    shard), else a one-dimensional one of the single replica."""

    grid: tuple[tuple[int, ...], ...]
    hsdp: bool

    def __post_init__(self) -> None:
        sizes = {len(row) for row in self.grid}
        ranks = sorted(rank for row in self.grid for rank in row)
        if len(sizes) != 1 or 0 in sizes or ranks != list(range(len(ranks))):
            raise ValueError(f"a layout is a full grid of the ranks 0..n-1, got {self.grid}")
        if not self.hsdp and len(self.grid) != 1:
            raise ValueError(f"a one-dimensional layout has one replica, got {self.grid}")
        lines = [*self.grid, *zip(*self.grid, strict=True)]
        if any(list(line) != sorted(line) for line in lines):
            # torch's process groups order their ranks, and FSDP2 shards by that order
            raise LayoutError(
                f"ranks laid out as {self.grid}: each replica's ranks, and each shard's "
                "across replicas, must come in rank order (a pod's ranks together)"
            )

    @property
    def replicas(self) -> int:
        return len(self.grid)

    @property
    def shards(self) -> int:
        """How many shards each replica splits the state into (the shard size)."""
        return len(self.grid[0])

    @property
    def world(self) -> int:
        return self.replicas * self.shards

    def shard_of(self, rank: int) -> int:
        """The shard ``rank`` holds."""
        for row in self.grid:
            if rank in row:
                return row.index(rank)
        raise ValueError(f"rank {rank} is not in {self.grid}")

    def mesh_dim_names(self) -> tuple[str, ...]:
        """The names of the device mesh's dimensions."""
        return (REPLICATE, SHARD) if self.hsdp else (SHARD,)

    def mesh_ranks(self) -> list[list[int]] | list[int]:
        """The ranks as a device mesh lays them out (``DeviceMesh(..., mesh=...)``)."""
        return [list(row) for row in self.grid] if self.hsdp else list(self.grid[0])


def plan_layout(hosts: Sequence[str], shard_size: int | None, hsdp: bool) -> MeshLayout:
    """The layout of a round whose ranks run on ``hosts`` (by rank: a pod): one replica of
    every rank (``hsdp`` false); replicas of ``shard_size`` consecutive ranks; or (None) each
    host's ranks, split into replicas of the greatest common divisor of the hosts' rank
    counts where they differ (a pod with fewer slots). Raises :class:`LayoutError` where a
    shard size does not divide the world."""
    return MeshLayout(tuple(tuple(r) for r in _replicas(hosts, shard_size, hsdp)), hsdp)


def _replicas(hosts: Sequence[str], shard_size: int | None, hsdp: bool) -> list[list[int]]:
    world = len(hosts)
    if not hsdp:
        return [list(range(world))]
    if shard_size is None:
        by_host: dict[str, list[int]] = {}
        for rank, host in enumerate(hosts):
            by_host.setdefault(host, []).append(rank)
        size = math.gcd(*(len(ranks) for ranks in by_host.values()))
        return [
            ranks[i : i + size] for ranks in by_host.values() for i in range(0, len(ranks), size)
        ]
    if shard_size < 1 or world % shard_size:
        raise LayoutError(
            f"HSDP with shard_size={shard_size}: a world of {world} ranks is not a whole "
            "number of replicas; keep the job's sizes multiples of the shard size, or leave "
            "shard_size unset (a pod's slots)"
        )
    return [list(range(i, i + shard_size)) for i in range(0, world, shard_size)]
