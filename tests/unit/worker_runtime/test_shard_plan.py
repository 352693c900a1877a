"""The pure plan of a sharded state: FSDP2's row layout, who keeps copies of whose shards,
and the transfers that reshard committed state onto a new world."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticjob.worker_runtime.elastic.sharded.shard_plan import (
    LostShards,
    RowLayout,
    Transfer,
    copy_holders,
    plan_reshard,
)


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
    assert plan_reshard(8, old_world, holders, new_world) == expected


def test_an_empty_shard_is_never_lost() -> None:
    transfers = plan_reshard(3, 4, {0: [0], 1: [1], 2: [2], 3: []}, 3)
    assert not isinstance(transfers, LostShards)


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
    plan = plan_reshard(rows, old_world, holders, new_world)
    assert not isinstance(plan, LostShards)
    old, new = RowLayout(rows, old_world), RowLayout(rows, new_world)
    built = {r: [None] * (new.span(r)[1] - new.span(r)[0]) for r in range(new_world)}
    for move in plan:
        assert move.source in holders[move.old_rank]
        assert move.source == move.target or move.target not in holders[move.old_rank]
        old_start = old.span(move.old_rank)[0]
        rows_moved = range(old_start + move.old_rows[0], old_start + move.old_rows[1])
        for offset, row in enumerate(rows_moved):
            slot = move.new_rows[0] + offset
            assert built[move.target][slot] is None, "a row sent twice"
            built[move.target][slot] = row
    for rank in range(new_world):
        assert built[rank] == list(range(*new.span(rank)))
