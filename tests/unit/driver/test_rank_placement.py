"""Placing a round's hosts so that a one-dimensional sharded state moves the fewest rows
(``rank_placement.place_hosts``): a table of the cases, and against every interleaving."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticjob.driver.rank_placement import kept_rows, place_hosts
from elasticjob.wire.messages import HeldShards, WorkerId


def held(shards: int, own: int, *copies: int) -> HeldShards:
    return HeldShards(shards=shards, own=own, copies=copies)


def w(host: str, local_rank: int = 0) -> WorkerId:
    return WorkerId(host, local_rank)


@pytest.mark.parametrize(
    ("old", "rank", "new", "expected"),
    [
        pytest.param(held(2, 0), 0, 3, 2, id="2-to-3-first-keeps-two-sixths"),
        pytest.param(held(2, 1), 1, 3, 1, id="2-to-3-second-in-the-middle-keeps-one"),
        pytest.param(held(2, 1), 2, 3, 2, id="2-to-3-second-last-keeps-two"),
        pytest.param(held(2, 1, 0), 1, 3, 2, id="a-copy-counts-as-held"),
        pytest.param(held(4, 3), 0, 4, 0, id="same-world-another-shard-keeps-nothing"),
        pytest.param(held(4, 2), 2, 4, 4, id="same-world-same-shard-keeps-all"),
    ],
)
def test_kept_rows(old: HeldShards, rank: int, new: int, expected: int) -> None:
    assert kept_rows(old, rank, new) == expected


@pytest.mark.parametrize(
    ("hosts", "survivors", "expected"),
    [
        pytest.param(
            [("a", 1), ("b", 1), ("n", 1)],
            {w("a"): held(2, 0), w("b"): held(2, 1)},
            ["a", "n", "b"],
            id="2-to-3-the-newcomer-goes-between",
        ),
        pytest.param(
            [("a", 1), ("b", 1), ("c", 1), ("d", 1), ("n", 1)],
            {w(h): held(4, i) for i, h in enumerate("abcd")},
            ["a", "b", "n", "c", "d"],
            id="4-to-5-the-newcomer-goes-in-the-middle",
        ),
        pytest.param(
            [("a", 1), ("b", 1), ("c", 1), ("d", 1), ("n", 1), ("m", 1)],
            {w(h): held(4, i) for i, h in enumerate("abcd")},
            ["a", "n", "b", "c", "m", "d"],
            id="4-to-6-two-newcomers-spread",
        ),
        pytest.param(
            [("a", 1), ("b", 1), ("d", 1), ("n", 1)],
            {w("a"): held(4, 0), w("b"): held(4, 1), w("d"): held(4, 3)},
            ["a", "b", "n", "d"],
            id="a-replacement-takes-the-lost-ranks-place",
        ),
        pytest.param(
            [("a", 1), ("b", 1), ("n", 1)],
            {w("a"): held(2, 0, 1), w("b"): held(2, 1, 0)},
            ["a", "b", "n"],
            id="copies-of-everything-keep-the-age-order",
        ),
        pytest.param(
            [("b", 1), ("a", 1), ("n", 1)],
            {w("a"): held(2, 0), w("b"): held(2, 1)},
            ["a", "n", "b"],
            id="survivors-by-the-shards-they-held-not-by-age",
        ),
        pytest.param(
            [("a", 2), ("b", 2), ("n", 2)],
            {w("a", 0): held(4, 0), w("a", 1): held(4, 1), w("b", 0): held(4, 2)},
            ["a", "n", "b"],
            id="multi-slot-hosts-move-whole",
        ),
        pytest.param(
            [("a", 1), ("b", 1), ("c", 1)],
            {w("b"): held(3, 1), w("a"): held(3, 0)},
            ["a", "b", "c"],
            id="no-newcomer-survivors-in-their-order",
        ),
        pytest.param(
            [("a", 1), ("b", 1), ("n", 1)],
            {},
            ["a", "b", "n"],
            id="nothing-held-oldest-first",
        ),
        pytest.param(
            [("a", 1), ("b", 1), ("n", 1)],
            {w("a"): held(2, 0), w("b"): held(3, 1)},
            ["a", "b", "n"],
            id="shard-counts-disagree-oldest-first",
        ),
        pytest.param(
            [("a", 2), ("b", 1), ("n", 1)],
            {w("a", 1): held(3, 1), w("b"): held(3, 2)},
            ["a", "b", "n"],
            id="no-survivor-for-rank-0-oldest-first",
        ),
    ],
)
def test_place_hosts(
    hosts: list[tuple[str, int]], survivors: dict[WorkerId, HeldShards], expected: list[str]
) -> None:
    placed = place_hosts(hosts, survivors)
    assert [name for name, _ in placed] == expected
    assert sorted(placed) == sorted(hosts), "every host keeps its slots"


def kept_in(order: list[tuple[str, int]], survivors: dict[WorkerId, HeldShards]) -> int:
    world = sum(slots for _, slots in order)
    first = {name: sum(s for _, s in order[:i]) for i, (name, _) in enumerate(order)}
    return sum(
        kept_rows(h, first[worker.hostname] + worker.local_rank, world)
        for worker, h in survivors.items()
    )


@given(
    old=st.integers(1, 6),
    lost=st.sets(st.integers(0, 5), max_size=3),
    newcomers=st.integers(1, 3),
    copies=st.booleans(),
)
def test_no_interleaving_keeps_more_rows(
    old: int, lost: set[int], newcomers: int, copies: bool
) -> None:
    """One slot per host: the placement keeps as many rows as the best interleaving of the
    survivors (in their order, the first first) and the newcomers."""
    alive = [rank for rank in range(old) if rank not in lost or rank == 0]
    survivors = {
        w(f"s{rank}"): held(old, rank, *([(rank - 1) % old] if copies and old > 1 else []))
        for rank in alive
    }
    kept_hosts = [(f"s{rank}", 1) for rank in alive]
    fresh = [(f"n{i}", 1) for i in range(newcomers)]
    placed = place_hosts([*kept_hosts, *fresh], survivors)
    best = max(
        kept_in(order, survivors)
        for positions in itertools.combinations(range(1, len(alive) + newcomers), newcomers)
        for order in [_interleaved(kept_hosts, fresh, positions)]
    )
    assert kept_in(list(placed), survivors) == best


def _interleaved(
    kept: list[tuple[str, int]], fresh: list[tuple[str, int]], positions: tuple[int, ...]
) -> list[tuple[str, int]]:
    survivors, newcomers = iter(kept), iter(fresh)
    return [
        next(newcomers) if i in positions else next(survivors)
        for i in range(len(kept) + len(fresh))
    ]
