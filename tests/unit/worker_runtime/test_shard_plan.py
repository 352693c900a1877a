"""The pure plan of a sharded state: FSDP2's row layout, who keeps copies of whose shards,
and the transfers that reshard committed state onto a new world."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticjob.worker_runtime.elastic.sharded.shard_layout import MeshLayout
from elasticjob.worker_runtime.elastic.sharded.shard_plan import (
    LostShards,
    RowLayout,
    Transfer,
    copy_holders,
    extra_copies,
    moved_bytes,
    plan_reshard,
)

KEY = ("model", "weight")


def fsdp(world: int) -> MeshLayout:
    """Every rank on a one-dimensional mesh, in rank order."""
    return MeshLayout((tuple(range(world)),), hsdp=False)


def hsdp(*replicas: tuple[int, ...]) -> MeshLayout:
    return MeshLayout(tuple(replicas), hsdp=True)


@pytest.mark.parametrize(
    ("rows", "world", "spans"),
    [
        (32, 3, [(0, 11), (11, 22), (22, 32)]),
        (10, 4, [(0, 3), (3, 6), (6, 9), (9, 10)]),
        (3, 4, [(0, 1), (1, 2), (2, 3), (3, 3)]),
        (0, 2, [(0, 0), (0, 0)]),
        (7, 1, [(0, 7)]),
    ],
)
def test_rows_are_split_as_torch_chunk_splits_them(
    rows: int, world: int, spans: list[tuple[int, int]]
) -> None:
    layout = RowLayout(rows, world)
    assert [layout.span(r) for r in range(world)] == spans


@pytest.mark.parametrize(
    ("hosts", "redundancy", "holders"),
    [
        (["a", "a", "b", "b"], 1, {0: (2,), 1: (3,), 2: (0,), 3: (1,)}),
        (
            ["a", "a", "b", "b", "c", "c"],
            1,
            {0: (2,), 1: (3,), 2: (4,), 3: (5,), 4: (0,), 5: (1,)},
        ),
        (["a", "b", "c"], 2, {0: (1, 2), 1: (2, 0), 2: (0, 1)}),
        (["a", "a"], 1, {0: (1,), 1: (0,)}),
        (["a", "a", "b"], 2, {0: (2, 1), 1: (2, 0), 2: (0, 1)}),
        (["a", "b"], 0, {0: (), 1: ()}),
        (["a"], 1, {0: ()}),
    ],
    ids=[
        "two-hosts",
        "three-hosts-of-two",
        "three-hosts",
        "one-host",
        "fill-with-host-mates",
        "none",
        "alone",
    ],
)
def test_copies_go_to_other_hosts_first(
    hosts: list[str], redundancy: int, holders: dict[int, tuple[int, ...]]
) -> None:
    assert copy_holders(hosts, redundancy) == holders


@pytest.mark.parametrize(
    ("old_world", "holders", "new_world", "expected"),
    [
        pytest.param(
            2,
            {0: [0], 1: [1]},
            2,
            (Transfer(0, 0, 0, (0, 4), (0, 4)), Transfer(1, 1, 1, (0, 4), (0, 4))),
            id="unchanged-world-stays-local",
        ),
        pytest.param(
            2,
            {0: [0], 1: [0]},
            1,
            (Transfer(0, 0, 0, (0, 4), (0, 4)), Transfer(0, 0, 1, (0, 4), (4, 8))),
            id="lost-rank-rebuilt-from-the-copy-a-survivor-holds",
        ),
        pytest.param(
            2,
            {0: [0], 1: [1]},
            4,
            (
                Transfer(0, 0, 0, (0, 2), (0, 2)),
                Transfer(0, 1, 0, (2, 4), (0, 2)),
                Transfer(1, 2, 1, (0, 2), (0, 2)),
                Transfer(1, 3, 1, (2, 4), (0, 2)),
            ),
            id="newcomers-get-exactly-their-rows",
        ),
        pytest.param(2, {0: [0], 1: []}, 1, LostShards((1,)), id="no-holder-left"),
    ],
)
def test_plans_for_eight_rows(
    old_world: int,
    holders: dict[int, list[int]],
    new_world: int,
    expected: tuple[Transfer, ...] | LostShards,
) -> None:
    plans = plan_reshard({KEY: (8,)}, old_world, holders, fsdp(new_world))
    assert (plans if isinstance(plans, LostShards) else plans[KEY]) == expected


def test_an_empty_shard_is_never_lost() -> None:
    transfers = plan_reshard({KEY: (3,)}, 4, {0: [0], 1: [1], 2: [2], 3: []}, fsdp(3))
    assert not isinstance(transfers, LostShards)


@pytest.mark.parametrize(
    ("replicas", "redundancy", "extra"),
    [(1, 1, 1), (2, 1, 0), (3, 1, 0), (2, 2, 1), (1, 0, 0), (4, 2, 0)],
)
def test_replicas_are_copies_a_commit_need_not_send(
    replicas: int, redundancy: int, extra: int
) -> None:
    assert extra_copies(redundancy, replicas) == extra


# HSDP, two slots a pod: a shard of 8 rows of 2 float32 columns is 4 rows, 32 bytes.
@pytest.mark.parametrize(
    ("holders", "layout", "moved", "sources"),
    [
        pytest.param(
            {0: [0, 2], 1: [1, 3]}, hsdp((0, 1), (2, 3)), 0, {}, id="unchanged-nothing-moves"
        ),
        pytest.param({0: [0], 1: [1]}, hsdp((0, 1)), 0, {}, id="a-lost-pod-moves-nothing"),
        pytest.param(
            {0: [0], 1: [1]},
            hsdp((0, 1), (2, 3), (4, 5)),
            128,
            {2: 0, 3: 1, 4: 0, 5: 1},
            id="two-new-pods-from-the-one-replica",
        ),
        pytest.param(
            {0: [0, 2], 1: [1, 3]},
            hsdp((0, 1), (2, 3), (4, 5), (6, 7)),
            128,
            {4: 0, 5: 1, 6: 2, 7: 3},
            id="two-new-pods-from-two-replicas",
        ),
        pytest.param(
            {0: [0, 2], 1: [1, 3]},
            fsdp(4),
            32,
            {1: 2, 2: 3},
            id="two-replicas-of-two-onto-four-shards-in-rank-order",
        ),
    ],
)
def test_hsdp_plans(
    holders: dict[int, list[int]], layout: MeshLayout, moved: int, sources: dict[int, int]
) -> None:
    """Sources by target: each receives from one rank that holds its shard (least loaded
    first, then nearest after it in ring order)."""
    plans = plan_reshard({KEY: (8, 2)}, 2, holders, layout)
    assert not isinstance(plans, LostShards)
    assert moved_bytes(plans, {KEY: (8, 2)}, {KEY: 4}) == moved
    assert {m.target: m.source for m in plans[KEY] if m.source != m.target} == sources


@given(
    rows=st.integers(0, 40),
    old_world=st.integers(1, 6),
    new_world=st.integers(1, 6),
    data=st.data(),
)
def test_executing_a_plan_rebuilds_every_new_shard_exactly(
    rows: int, old_world: int, new_world: int, data: st.DataObject
) -> None:
    """Every row of the tensor reaches the one rank that holds it in the new layout, from a
    rank that held it, and each rank receives nothing else."""
    holders = {
        r: data.draw(st.lists(st.integers(0, new_world - 1), min_size=1, max_size=3, unique=True))
        for r in range(old_world)
    }
    plans = plan_reshard({KEY: (rows,)}, old_world, holders, fsdp(new_world))
    assert not isinstance(plans, LostShards)
    plan = plans[KEY]
    old, new = RowLayout(rows, old_world), RowLayout(rows, new_world)
    built = {r: [None] * (new.span(r)[1] - new.span(r)[0]) for r in range(new_world)}
    for move in plan:
        assert move.source in holders[move.old_shard]
        assert move.source == move.target or move.target not in holders[move.old_shard]
        old_start = old.span(move.old_shard)[0]
        rows_moved = range(old_start + move.old_rows[0], old_start + move.old_rows[1])
        for offset, row in enumerate(rows_moved):
            slot = move.new_rows[0] + offset
            assert built[move.target][slot] is None, "a row sent twice"
            built[move.target][slot] = row
    for rank in range(new_world):
        assert built[rank] == list(range(*new.span(rank)))
