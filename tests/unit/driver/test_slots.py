"""assign_slots and missing_survivor."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticjob.driver.driver_types import DriverError
from elasticjob.driver.slot_assignment import (
    NotEnoughSlotsError,
    assign_slots,
    missing_survivor,
)
from elasticjob.wire.messages import WorkerId

# (hostname, rank, local_rank, cross_rank, size, local_size, cross_size)
Row = tuple[str, int, int, int, int, int, int]


@pytest.mark.parametrize(
    ("hosts", "min_np", "max_np", "expected"),
    [
        pytest.param([("a", 1)], 1, None, [("a", 0, 0, 0, 1, 1, 1)], id="single-slot"),
        pytest.param(
            [("a", 2), ("b", 2)],
            1,
            None,
            [
                ("a", 0, 0, 0, 4, 2, 2),
                ("a", 1, 1, 0, 4, 2, 2),
                ("b", 2, 0, 1, 4, 2, 2),
                ("b", 3, 1, 1, 4, 2, 2),
            ],
            id="two-hosts-two-slots",
        ),
        pytest.param(
            [("a", 2), ("b", 2)],
            1,
            3,
            [
                ("a", 0, 0, 0, 3, 2, 2),
                ("a", 1, 1, 0, 3, 2, 1),
                ("b", 2, 0, 1, 3, 1, 2),
            ],
            id="max-np-cuts-last-host",
        ),
        pytest.param(
            [("a", 1), ("b", 3), ("c", 2)],
            6,
            6,
            [
                ("a", 0, 0, 0, 6, 1, 3),
                ("b", 1, 0, 1, 6, 3, 3),
                ("b", 2, 1, 0, 6, 3, 2),
                ("b", 3, 2, 0, 6, 3, 1),
                ("c", 4, 0, 2, 6, 2, 3),
                ("c", 5, 1, 1, 6, 2, 2),
            ],
            id="uneven-slots-cross-ranks",
        ),
        pytest.param(
            [("b", 2), ("a", 2), ("c", 2)],
            2,
            2,
            [("b", 0, 0, 0, 2, 2, 1), ("b", 1, 1, 0, 2, 2, 1)],
            id="max-np-leaves-later-hosts-out-order-respected",
        ),
    ],
)
def test_assign_slots(
    hosts: list[tuple[str, int]], min_np: int, max_np: int | None, expected: list[Row]
) -> None:
    slots = assign_slots(hosts, min_np=min_np, max_np=max_np)
    rows = [
        (s.hostname, s.rank, s.local_rank, s.cross_rank, s.size, s.local_size, s.cross_size)
        for s in slots.values()
    ]
    assert rows == expected
    assert list(slots) == [WorkerId(row[0], row[2]) for row in expected]


@pytest.mark.parametrize(
    ("hosts", "min_np", "available"),
    [
        pytest.param([], 1, 0, id="no-hosts"),
        pytest.param([("a", 2), ("b", 1)], 4, 3, id="three-of-four"),
    ],
)
def test_not_enough_slots(hosts: list[tuple[str, int]], min_np: int, available: int) -> None:
    with pytest.raises(NotEnoughSlotsError, match=f"{available} slots available") as raised:
        assign_slots(hosts, min_np=min_np, max_np=None)
    assert f"at least {min_np}" in str(raised.value)
    assert isinstance(raised.value, DriverError)


@pytest.mark.parametrize(
    ("hosts", "min_np", "max_np"),
    [
        pytest.param([("a", 1)], 0, None, id="min-np-zero"),
        pytest.param([("a", 4)], 3, 2, id="max-below-min"),
        pytest.param([("a", 1), ("a", 1)], 1, None, id="duplicate-host"),
        pytest.param([("a", 0)], 1, None, id="zero-slots"),
    ],
)
def test_bad_arguments(hosts: list[tuple[str, int]], min_np: int, max_np: int | None) -> None:
    with pytest.raises(ValueError):
        assign_slots(hosts, min_np=min_np, max_np=max_np)


@st.composite
def ordered_hosts(draw: st.DrawFn) -> list[tuple[str, int]]:
    """Distinct hosts in a random order, each with 1 to 8 slots."""
    names = draw(st.permutations([f"h{i}" for i in range(8)]))
    count = draw(st.integers(1, len(names)))
    return [(name, draw(st.integers(1, 8))) for name in names[:count]]


@given(hosts=ordered_hosts(), max_np=st.none() | st.integers(1, 70))
def test_assign_slots_properties(hosts: list[tuple[str, int]], max_np: int | None) -> None:
    slots = assign_slots(hosts, min_np=1, max_np=max_np)
    infos = list(slots.values())
    size = len(infos)
    available = sum(n for _, n in hosts)
    assert size == (available if max_np is None else min(available, max_np))
    assert [s.rank for s in infos] == list(range(size))
    assert all(s.size == size for s in infos)
    assert all(WorkerId(s.hostname, s.local_rank) == w for w, s in slots.items())
    # Hosts are used in order, each fully before the next; only the last one may be cut.
    used = list(dict.fromkeys(s.hostname for s in infos))
    assert used == [h for h, _ in hosts[: len(used)]]
    per_host = {h: [s for s in infos if s.hostname == h] for h in used}
    capacity = dict(hosts)
    for i, host in enumerate(used):
        local = per_host[host]
        assert [s.local_rank for s in local] == list(range(len(local)))
        assert all(s.local_size == len(local) for s in local)
        if i < len(used) - 1:
            assert len(local) == capacity[host]
        assert len(local) <= capacity[host]
    # Cross ranks: for each local rank, the hosts holding it, in host order.
    for local_rank in range(max(len(v) for v in per_host.values())):
        holders = [s for s in infos if s.local_rank == local_rank]
        assert [s.cross_rank for s in holders] == list(range(len(holders)))
        assert all(s.cross_size == len(holders) for s in holders)
        assert [s.hostname for s in holders] == [h for h in used if len(per_host[h]) > local_rank]


A0, A1, B0, C0 = WorkerId("a", 0), WorkerId("a", 1), WorkerId("b", 0), WorkerId("c", 0)


@pytest.mark.parametrize(
    ("survivors", "slots"),
    [
        pytest.param(None, [A0], id="first-round"),
        pytest.param(None, [], id="first-round-no-slots"),
        pytest.param([A0, B0], [A0, C0], id="rank0-survives"),
        pytest.param([A0, B0], [B0, C0], id="other-survivor-first"),
    ],
)
def test_continuity_ok(survivors: list[WorkerId] | None, slots: list[WorkerId]) -> None:
    assert missing_survivor(survivors, slots) is None


@pytest.mark.parametrize(
    ("survivors", "slots", "says"),
    [
        pytest.param([], [C0, B0], "no worker of the previous round survives", id="all-replaced"),
        pytest.param([], [], "no worker can start", id="no-slots-left"),
        pytest.param([A0], [C0, A0], "fresh process c[0], not one of", id="survivor-not-first"),
        pytest.param(
            [A1], [A0, A1], "fresh process a[0], not one of", id="fresh-process-on-survivor-host"
        ),
    ],
)
def test_continuity_broken(survivors: list[WorkerId], slots: list[WorkerId], says: str) -> None:
    problem = missing_survivor(survivors, slots)
    assert problem is not None and says in problem
    assert all(str(w) in problem for w in survivors)


def test_equal_hosts_share_one_read_only_assignment() -> None:
    """The driver plans on every step: the same hosts must not build the slots again."""
    first = assign_slots([("a", 2), ("b", 1)], min_np=1, max_np=None)
    again = assign_slots((("a", 2), ("b", 1)), min_np=1, max_np=None)
    assert again is first
    assert assign_slots([("a", 2), ("b", 1)], min_np=1, max_np=2) is not first
    with pytest.raises(TypeError):
        first[WorkerId("c", 0)] = first[WorkerId("a", 0)]  # type: ignore[index]
