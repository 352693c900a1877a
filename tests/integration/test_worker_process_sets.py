"""Horovod's process sets over 2 and 3 real processes.

``workers/process_sets_worker.py`` runs in the worker-API suite's launcher job (Gloo on loopback
hosts): the even ranks' set comes from ``init(process_sets=...)``, the odd ranks' from
``add_process_set``; both sets run every collective at once under the same names, each over its own
members only (sums, averages, gathers in set-rank order, a broadcast from a global root rank, a
reduce-scatter, an all-to-all, a grouped reduction, a barrier, a gradient), and a
``DistributedOptimizer`` over the even set steps on its members' average. A non-member's call, a
duplicate set and a removed set are refused; a new round voids every set but the global one until it
is registered again.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.worker_scripts import api_suite_part

pytestmark = pytest.mark.integration

Json = dict[str, Any]


@pytest.fixture(scope="module", params=[2, 3], ids=["2 processes", "3 processes"])
def ranks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[Json]:
    return api_suite_part("process_sets", request.param, tmp_path_factory)


def members(rank: int, size: int) -> list[int]:
    return [r for r in range(size) if r % 2 == rank % 2]


def test_each_sets_collectives_run_over_its_members_only(ranks: list[Json]) -> None:
    size = len(ranks)
    for found in ranks:
        rank, got = found["rank"], found["collectives"]
        mine = members(rank, size)
        n = len(mine)
        assert got["ranks"] == mine and got["size"] == n, got
        assert got["id"] == (1 if rank % 2 == 0 else 2), got
        assert got["set_rank"] == mine.index(rank), got
        assert got["str"] == f"ProcessSet(process_set_id={got['id']}, ranks={mine})"
        assert got["sum"] == sum(r + 1 for r in mine), got
        assert got["grad"] == float(n), "an allreduce's gradient is reduced over the set"
        assert got["rows"] == [float(r) for r in mine for _ in range(r + 1)], got
        assert got["mean"] == sum(mine) / n, got
        assert got["broadcast"] == float(mine[-1]), "root_rank is a global rank"
        total = [float(i * sum(r + 1 for r in mine)) for i in range(2 * n)]
        position = mine.index(rank)
        assert got["scattered"] == total[2 * position : 2 * position + 2], got
        assert got["exchanged"] == [float(r) for r in mine], got
        assert got["grouped"] == [[float(n)] * 2, [n] * 3], got
        assert got["object"] == {"from": mine[-1]}, got
        assert got["objects"] == [f"rank {r}" for r in mine], got
    assert ranks[0]["global_str"] == f"ProcessSet(process_set_id=0, ranks={list(range(size))})"


def test_a_distributed_optimizer_over_a_set_averages_over_its_members_only(
    ranks: list[Json],
) -> None:
    """Every rank builds it (Horovod's ``test_optimizer_process_sets``); the even ranks
    step on their set's average gradient, the others on their own, as Horovod's do."""
    size = len(ranks)
    even = members(0, size)
    for found in ranks:
        rank = found["rank"]
        own = float((rank + 1) ** 2)
        average = sum((r + 1) ** 2 for r in even) / len(even)
        assert found["optimizer_over_even"] == -(average if rank in even else own), found


def test_what_a_rank_may_not_do_with_a_set_is_refused_by_name(ranks: list[Json]) -> None:
    for found in ranks:
        assert "which it is not part of" in found["not_a_member"], found
        assert "duplicate process set" in found["duplicate"], found
        assert found["removed"] is True and found["global_removed"] is False, found
        if found["rank"] % 2:
            assert "is not registered in this round" in found["after_removal"], found


def test_a_new_round_voids_the_sets_until_they_are_registered_again(ranks: list[Json]) -> None:
    size = len(ranks)
    for found in ranks:
        assert found["void_id"] is None, found
        if found["rank"] % 2 == 0:
            assert "hvd.add_process_set" in found["void"], found
            assert found["again"] == float(len(members(0, size))), found
