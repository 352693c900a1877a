"""The bytes a one-dimensional sharded state's scale-out moves, with the newcomers placed last
(hosts oldest first) and placed where the fewest rows move (``rank_placement.place_hosts``),
by the reshard's own plan (``shard_plan.plan_reshard``): no process runs.

The state is the wide MLP of ``bench/sharded_recovery.py`` at about 100M parameters
(``--params``) with AdamW's two moments, float32; one rank per host, each on a node of its
own, the copies where ``copy_holders`` puts them.

Usage: python bench/rank_placement.py [--params 100e6] [--layers 4]
"""

from __future__ import annotations

import argparse
import math

from elasticjob.driver.rank_placement import place_hosts
from elasticjob.wire.messages import HeldShards, WorkerId
from elasticjob.worker_runtime.elastic.sharded.shard_layout import MeshLayout
from elasticjob.worker_runtime.elastic.sharded.shard_plan import (
    Key,
    LostShards,
    copy_holders,
    moved_bytes,
    plan_reshard,
)

SCALE_OUTS = ((2, 3), (2, 4), (3, 4), (4, 5), (4, 6), (4, 8), (8, 10), (8, 12))


def shapes_of(params: float, layers: int) -> dict[Key, tuple[int, ...]]:
    """The MLP's parameters and AdamW's two moments, by entry."""
    dim = 64 * math.ceil(math.sqrt(params / layers) / 64)
    shapes: dict[Key, tuple[int, ...]] = {}
    for layer in range(layers):
        for name, shape in ((f"{layer}.weight", (dim, dim)), (f"{layer}.bias", (dim,))):
            shapes["model", name] = shape
            for moment in ("exp_avg", "exp_avg_sq"):
                shapes["optimizer", f"state.{name}.{moment}"] = shape
    return shapes


def copies_held(old: int, redundancy: int) -> dict[int, list[int]]:
    """The shards each of ``old`` ranks, one per node, keeps copies of."""
    copies: dict[int, list[int]] = {r: [] for r in range(old)}
    for rank, holders in copy_holders([f"node-{r}" for r in range(old)], redundancy).items():
        for holder in holders:
            copies[holder].append(rank)
    return copies


def moved(
    shapes: dict[Key, tuple[int, ...]], old: int, order: list[int | None], redundancy: int
) -> int:
    """Bytes sent to reshard from ``old`` ranks onto the new ranks ``order`` (each the old
    rank that holds that new rank, or None: a newcomer)."""
    copies = copies_held(old, redundancy)
    new_rank = {r: i for i, r in enumerate(order) if r is not None}
    holders = {s: [new_rank[r] for r in range(old) if s == r or s in copies[r]] for s in range(old)}
    plans = plan_reshard(shapes, old, holders, MeshLayout((tuple(range(len(order))),), False))
    assert not isinstance(plans, LostShards)
    return moved_bytes(plans, shapes, dict.fromkeys(shapes, 4))


def placed_order(old: int, new: int, redundancy: int) -> list[int | None]:
    """The old rank of each new rank (None: a newcomer) as ``place_hosts`` orders them."""
    copies = copies_held(old, redundancy)
    held = {
        WorkerId(f"s{r}", 0): HeldShards(shards=old, own=r, copies=tuple(copies[r]))
        for r in range(old)
    }
    hosts = [(f"s{r}", 1) for r in range(old)] + [(f"n{i}", 1) for i in range(new - old)]
    return [int(name[1:]) if name.startswith("s") else None for name, _ in place_hosts(hosts, held)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=100e6)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    shapes = shapes_of(args.params, args.layers)
    total = sum(math.prod(shape) for shape in shapes.values()) * 4
    print(f"state: {total / 1e9:.2f} GB ({total // 12 / 1e6:.1f} M parameters with AdamW)")
    print(f"{'scale-out':>10} {'copies':>6} {'newcomers last':>15} {'placed':>9} {'ratio':>6}")
    for old, new in SCALE_OUTS:
        for redundancy in (0, 1):
            last = moved(shapes, old, [*range(old), *[None] * (new - old)], redundancy)
            placed = moved(shapes, old, placed_order(old, new, redundancy), redundancy)
            ratio = f"{placed / last:.2f}" if last else "-"
            print(
                f"{f'{old} -> {new}':>10} {redundancy:>6} {last / 1e9:>12.3f} GB "
                f"{placed / 1e9:>6.3f} GB {ratio:>6}"
            )


if __name__ == "__main__":
    main()
