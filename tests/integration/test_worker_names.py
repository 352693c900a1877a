"""Collectives matched by name, as in Horovod, over 2 and 3 real processes.

``workers/names_worker.py`` runs in the worker-API suite's launcher job (Gloo on loopback hosts): a
name with a call outstanding is refused on the rank that repeats it, while its partners' calls may
come after a barrier; ranks may start named collectives in different orders; and every kind of
mismatch between the ranks' calls raises the same error on every rank, naming it, with no data
moved: an allreduce right after it gives the right sum.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.worker_scripts import api_suite_part

pytestmark = pytest.mark.integration

Json = dict[str, Any]

MISMATCH_WORDS = {
    "dtype": "Mismatched data types",
    "shape": "Mismatched allreduce tensor shapes",
    "op": "Mismatched reduction operations",
    "prescale": "Mismatched prescale factors",
    "postscale": "Mismatched postscale factors",
    "root": "Mismatched broadcast root ranks",
    "operation": "Mismatched operations",
    "gather_shape": "Mismatched allgather tensor shapes",
    "gather_rank": "Mismatched allgather tensor ranks",
    "alltoall_shape": "Mismatched alltoall tensor shapes",
    "grouped_count": "Mismatched number of tensors in grouped",
    "reducescatter_shape": "Mismatched reducescatter tensor shapes",
}


@pytest.fixture(scope="module", params=[2, 3], ids=["2 processes", "3 processes"])
def ranks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[Json]:
    return api_suite_part("names", request.param, tmp_path_factory)


def test_a_name_outstanding_is_refused_and_its_partners_may_come_after_a_barrier(
    ranks: list[Json],
) -> None:
    size = len(ranks)
    expected = [float(sum(range(1, size + 1)))] * 4
    for found in ranks:
        duplicate = found["duplicate"]
        assert duplicate["sum"] == expected, found
        (refused,) = duplicate["refused"]
        assert "'dup' is already in progress" in refused, refused


def test_named_collectives_started_in_different_orders_complete(ranks: list[Json]) -> None:
    size = len(ranks)
    for found in ranks:
        assert found["crossed"]["a"] == sum(1.0 + r for r in range(size)), found
        assert found["crossed"]["b"] == sum(10.0 * (r + 1) for r in range(size)), found


def test_a_name_called_again_is_checked_every_time(ranks: list[Json]) -> None:
    """Calls repeated as last time are agreed on from a count alone: rows that change from
    step to step still gather right, and a call changed on one rank alone is caught."""
    size = len(ranks)
    for found in ranks:
        repeated = found["repeated"]
        assert repeated["sums"] == [float(step * size) for step in range(5)], found
        assert repeated["rows"] == [sum(r + step for r in range(size)) for step in (1, 2, 3)]
        assert repeated["raised"] is not None, found
        assert "Mismatched data types: rank 0 sent int32, rank 1 sent float32" in repeated["raised"]
        assert repeated["again"] == float(size), found


def test_agreed_collectives_leave_no_keys_in_the_rounds_store(ranks: list[Json]) -> None:
    """80 collectives of a long round would leave hundreds of keys if none were removed."""
    for found in ranks:
        assert found["store_growth"] <= 2, found


@pytest.mark.parametrize("kind", sorted(MISMATCH_WORDS))
def test_a_mismatch_raises_on_every_rank_and_the_group_goes_on(
    ranks: list[Json], kind: str
) -> None:
    messages = set()
    for found in ranks:
        outcome = found["mismatches"][kind]
        raised = outcome["raised"]
        assert raised is not None, f"rank {found['rank']} raised nothing for {kind}"
        assert raised["type"] == "CollectiveMismatchError", raised
        assert MISMATCH_WORDS[kind] in raised["message"], raised
        assert "no data was exchanged" in raised["message"], raised
        messages.add(raised["message"])
        assert outcome["after"] == float(len(ranks)), f"the group broke after {kind}: {found}"
    assert len(messages) == 1, f"the ranks were told different things: {messages}"


def test_the_mismatch_error_is_a_runtime_error(ranks: list[Json]) -> None:
    """Horovod's tests accept RuntimeError (and ValueError) for mismatches."""
    assert all(found["isinstance"] for found in ranks)
