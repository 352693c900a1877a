"""``reshard`` on a world of one, where nothing is sent: a new shard that is one of the rank's
old shards whole is handed over as it is (borrowed, not copied); any other is built from
copies of the rows it needs."""

from __future__ import annotations

from typing import cast

import pytest
import torch
import torch.distributed as dist

from elasticjob.worker_runtime.elastic.sharded.shard_exchange import Shards, reshard
from elasticjob.worker_runtime.elastic.sharded.shard_layout import MeshLayout
from elasticjob.worker_runtime.elastic.sharded.shard_plan import LostShards, plan_reshard

KEY = ("optimizer", "state.weight.exp_avg")
ONE_RANK = MeshLayout(((0,),), hsdp=False)
NO_GROUP = cast(dist.ProcessGroup, None)
"""Nothing moves between ranks in a world of one: the group is never used."""


@pytest.mark.parametrize(
    ("rows", "old_shards", "held_shards", "borrowed_from"),
    [
        (6, 1, (0,), 0),  # the rank keeps its shard
        (6, 2, (0, 1), None),  # its own shard and a copy make the new one: copied
        (1, 2, (0, 1), 0),  # the other old shard is empty: the one that holds the row, whole
    ],
    ids=["kept", "merged", "one-holding-every-row"],
)
def test_a_shard_kept_whole_is_handed_over_and_any_other_is_copied(
    rows: int, old_shards: int, held_shards: tuple[int, ...], borrowed_from: int | None
) -> None:
    tensor = torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2)
    held: dict[int, Shards] = {
        s: {KEY: chunk} for s, chunk in zip(held_shards, tensor.chunk(old_shards), strict=False)
    }
    for s in held_shards:  # torch.chunk gives no chunk for an empty shard
        held.setdefault(s, {KEY: tensor[rows:]})
    plans = plan_reshard({KEY: (rows, 2)}, old_shards, {s: [0] for s in held_shards}, ONE_RANK)
    assert not isinstance(plans, LostShards)
    new = reshard(plans, {KEY: (rows, 2)}, {KEY: torch.float32}, held, ONE_RANK, 0, NO_GROUP)
    assert torch.equal(new.shards[KEY], tensor)
    if borrowed_from is None:
        assert new.borrowed == frozenset()
        assert all(new.shards[KEY].data_ptr() != h[KEY].data_ptr() for h in held.values())
    else:
        assert new.borrowed == {KEY}
        assert new.shards[KEY].data_ptr() == held[borrowed_from][KEY].data_ptr()
