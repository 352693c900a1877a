"""Where each rank of a round sits on a sharded state's mesh (``shard_layout.py``): replicas by
pod or by shard size, and each rank placed on the shard it holds most of, so that the fewest
bytes move."""

from __future__ import annotations

import pytest

from elasticjob.worker_runtime.elastic.sharded.shard_layout import (
    LayoutError,
    MeshLayout,
    plan_layout,
)


@pytest.mark.parametrize(
    ("hosts", "shard_size", "hsdp", "grid"),
    [
        pytest.param(["a", "a", "b", "b"], None, False, [[0, 1, 2, 3]], id="fsdp-one-replica"),
        pytest.param(["a", "a", "b", "b"], None, True, [[0, 1], [2, 3]], id="a-replica-a-pod"),
        pytest.param(["a", "b", "c", "d"], 2, True, [[0, 1], [2, 3]], id="shard-size-over-pods"),
        pytest.param(["a"] * 4, 2, True, [[0, 1], [2, 3]], id="shard-size-within-a-pod"),
        pytest.param(
            ["a", "a", "a", "a", "b", "b"],
            None,
            True,
            [[0, 1], [2, 3], [4, 5]],
            id="a-pod-with-fewer-slots-splits-the-others",
        ),
        pytest.param(["a", "a", "b"], None, True, [[0], [1], [2]], id="a-rank-lost-inside-a-pod"),
    ],
)
def test_layouts(
    hosts: list[str], shard_size: int | None, hsdp: bool, grid: list[list[int]]
) -> None:
    layout = plan_layout(hosts, shard_size, hsdp)
    assert layout == MeshLayout(tuple(tuple(row) for row in grid), hsdp)


def test_a_shard_size_that_does_not_divide_the_world_is_refused_clearly() -> None:
    with pytest.raises(LayoutError, match="a world of 3 ranks is not a whole number of replicas"):
        plan_layout(["a", "b", "c"], 2, True)


def test_a_layout_is_a_full_grid_in_rank_order() -> None:
    """torch's process groups order their ranks, and FSDP2 shards in that order (a mesh
    ``[0, 2, 1]`` still gives rank 1 the second shard): a layout is in rank order both ways."""
    with pytest.raises(ValueError, match="full grid"):
        MeshLayout(((0, 1), (2,)), hsdp=True)
    with pytest.raises(ValueError, match="one replica"):
        MeshLayout(((0,), (1,)), hsdp=False)
    with pytest.raises(LayoutError, match="must come in rank order"):
        MeshLayout(((1, 0), (2, 3)), hsdp=True)
    with pytest.raises(LayoutError, match="must come in rank order"):
        MeshLayout(((2, 3), (0, 1)), hsdp=True)


def test_shard_positions() -> None:
    layout = MeshLayout(((0, 1), (2, 3)), hsdp=True)
    assert [layout.shard_of(r) for r in range(4)] == [0, 1, 0, 1]
    assert layout.mesh_ranks() == [[0, 1], [2, 3]]
    assert layout.mesh_dim_names() == ("replicate", "shard")
    assert MeshLayout(((0, 1),), hsdp=False).mesh_dim_names() == ("shard",)
