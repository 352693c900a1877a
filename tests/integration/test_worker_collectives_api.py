"""Horovod's further collective API across real processes: async handles, grouped reductions,
alltoall, reducescatter, barrier, join, SyncBatchNorm, the global process set, build flags,
the script's timeline, Adasum refused; and their abort when a peer dies.

As in ``test_worker_api.py``: the worker-API suite's 3-process Gloo job on the loopback hosts
127.0.1.1 (2 slots) and 127.0.1.2 (1 slot) and one standalone run of ``collectives_worker.py``;
expected values
are computed for the world at hand. The abort test SIGKILLs rank 2 while rank 0 waits in a
barrier and rank 1 on an async handle, with a long collective timeout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.worker_scripts import (
    Result,
    api_suite_part,
    run_abort_scenario,
    run_standalone,
    section,
)

pytestmark = pytest.mark.integration

WORKER = Path(__file__).parent / "workers" / "collectives_worker.py"
ABORT_COLLECTIVE_TIMEOUT_S = 60
"""The abort test's collective timeout: a raise must come well before it."""
PROMPT_S = 10.0
"""How soon after the kill the survivors' waits must raise."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> list[Result]:
    """Every rank's results from the worker-API suite's 3-process job on two hosts."""
    return api_suite_part("collectives", 3, tmp_path_factory)


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> list[Result]:
    return run_standalone(WORKER, tmp_path_factory)


@pytest.fixture(params=["cluster", "standalone"])
def world(request: pytest.FixtureRequest) -> list[Result]:
    results: list[Result] = request.getfixturevalue(request.param)
    return results


def flat(value: Any) -> list[float]:
    """Nested lists of numbers as one flat list (``pytest.approx`` takes no nesting)."""
    if isinstance(value, list):
        return [x for item in value for x in flat(item)]
    return [value]


def column_sums(rows: list[list[float]]) -> list[float]:
    return [sum(col) for col in zip(*rows, strict=True)]


def test_async_handles(world: list[Result]) -> None:
    n = len(world)
    for r, got in enumerate(section(world, "async")):
        assert got["handles_are_ints"] is True
        assert got["poll_types"] == ["bool"] * 5
        assert got["sum"] == column_sums([[q + 1.0, 2.0 * q] for q in range(n)])
        assert got["input_unchanged"] is True
        mean = [[sum(q for q in range(n)) / n, 3.0], [1.0, -sum(q for q in range(n)) / n]]
        assert flat(got["avg_inplace"]) == pytest.approx(flat(mean))
        assert got["avg_is_input"] is True
        assert got["broadcast"] == [(n - 1) * 10.0, 1.0]
        assert got["broadcast_inplace"] == [0, 0, 0]
        assert got["broadcast_inplace_is_input"] is True
        assert got["allgather"] == [[float(q)] * 2 for q in range(n) for _ in range(q + 1)]
        assert got["synchronize_again"] is None, "a synchronized handle is forgotten"
        assert got["poll_after"].startswith("ValueError: unknown handle"), r


def test_grouped_allreduce(world: list[Result]) -> None:
    n = len(world)
    ranks = range(n)
    sums: list[list[Any]] = [
        [sum(q + 1.0 for q in ranks), -1.0 * n],
        [[sum(q * 0.5 for q in ranks)], [2.0 * n]],
        [sum(ranks), sum(10 * q + 1 for q in ranks)],
    ]
    for got in section(world, "grouped"):
        assert flat(got["sum"]) == pytest.approx(flat(sums))
        assert (
            got["dtypes"]
            == got["fp16_dtypes"]
            == [
                "torch.float32",
                "torch.float64",
                "torch.int64",
            ]
        )
        assert flat(got["fp16"]) == pytest.approx(flat(sums))  # values exact in half precision
        assert got["fp16_plain"] == [sum(q + 0.5 for q in ranks)]
        assert got["average"][0] == pytest.approx([v / n for v in sums[0]])
        assert flat(got["average"][1]) == pytest.approx([v[0] / n for v in sums[1]])
        assert got["average"][2] == [v // n for v in sums[2]]  # integers round down
        assert got["average_is_input"] is True
        assert got["async_sum_post2"][0] == pytest.approx([2 * v for v in sums[0]])
        assert got["async_sum_post2"][2] == [2 * v for v in sums[2]]


def test_alltoall_with_and_without_splits(world: list[Result]) -> None:
    n = len(world)
    splits = [[(q + j + 1) % 3 for j in range(n)] for q in range(n)]
    for r, got in enumerate(section(world, "alltoall")):
        expected = []
        for q in range(n):
            start = sum(splits[q][:r])
            expected += [[100.0 * q + k, -1.0] for k in range(start, start + splits[q][r])]
        assert got["received"] == expected
        assert got["received_splits"] == [splits[q][r] for q in range(n)]
        assert got["received_splits_dtype"] == "torch.int64"
        even = [10 * q + k for q in range(n) for k in (2 * r, 2 * r + 1)]
        assert got["even"] == got["even_async"] == even
        assert got["even_async_splits"] == [2] * n
        assert got["bad_splits"].startswith("ValueError: alltoall splits")


def test_reducescatter_splits_rows_as_horovod(world: list[Result]) -> None:
    n = len(world)
    rows = 2 * n + 1
    total = [[sum((q + 1.0) * (k + 1) for q in range(n)), float(k) * n] for k in range(rows)]
    base, extra = divmod(rows, n)
    first = 0
    for r, got in enumerate(section(world, "reducescatter")):
        count = base + (1 if r < extra else 0)
        mine = total[first : first + count]
        first += count
        assert flat(got["sum"]) == pytest.approx(flat(mine))
        assert got["fp16"] == got["sum"] and got["fp16_dtype"] == "torch.float32"
        assert flat(got["average"]) == pytest.approx([v / n for v in flat(mine)])


def test_grouped_allgather_reducescatter_and_sparse_allreduce(world: list[Result]) -> None:
    n = len(world)
    rows = 2 * n + 1
    base, extra = divmod(rows, n)
    first = 0
    for r, got in enumerate(section(world, "grouped_gather_scatter")):
        assert got["gathered"] == [
            [[float(q), float(q)] for q in range(n) for _ in range(q + 1)],
            [10 * q for q in range(n)],
        ]
        assert got["gathered_dtypes"] == ["torch.float32", "torch.int64"]
        assert got["gathered_async"] == [[v for q in range(n) for v in (q, -q)]]
        count = base + (1 if r < extra else 0)
        column = [sum((q + 1.0) * (k + 1) for q in range(n)) for k in range(rows)]
        mine = column[first : first + count]
        first += count
        assert flat(got["scatter_sum"][0]) == pytest.approx(mine)
        assert got["scatter_sum"][1] == [[float(n)] * 3]  # n rows over n ranks: one each
        assert flat(got["scatter_average"][0]) == pytest.approx([v / n for v in mine])
        assert got["scatter_average"][1] == [[1.0] * 3]
        dense = [0.0] * 4
        for q in range(n):
            dense[q % 2] += 1.0
            dense[3] += q + 1.0
        assert got["sparse_sum"] == pytest.approx(dense)
        assert got["sparse_average"] == pytest.approx([v / n for v in dense])
        assert got["sparse_is_sparse"] is True
        assert got["sparse_dense_input"].startswith("ValueError: sparse_allreduce_async needs")


def test_barrier_and_join(world: list[Result]) -> None:
    n = len(world)
    for got in section(world, "coordination"):
        assert got["barrier_waited_s"] >= 0.45  # rank 0 came 0.5 s late
        assert got["join"] == [n - 1, 0]


def test_a_joined_rank_serves_the_others_allreduces_with_zeros(world: list[Result]) -> None:
    """Horovod's semantics (its ``test_horovod_join_allreduce`` / ``_allgather``): rank 0 has
    joined; the others' average counts it with zeros; an allgather is refused on them; every
    rank's join returns the same last rank, one of the others."""
    n = len(world)
    got = section(world, "join")
    if n == 1:
        assert got == [{"last": 0}], "alone, a rank's join returns at once"
        return
    assert len({g["last"] for g in got}) == 1 and got[0]["last"] != 0, got
    for g in got[1:]:
        assert g["averaged"] == pytest.approx([sum(q + 1 for q in range(1, n)) / n] * 3), g
        assert "Allgather is not supported with Join" in g["refused"], g


def test_sync_batch_norm_matches_batch_norm_on_the_whole_batch(world: list[Result]) -> None:
    for got in section(world, "sync_batch_norm"):
        assert got["batches_tracked"] == 1
        for key in ("output", "input_grad", "weight_grad", "bias_grad"):
            assert got[key] < 1e-9, key
        for key in ("running_mean", "running_var", "eval_output"):
            assert got[key] < 1e-9, key


def test_the_global_process_set_and_sets_not_registered(world: list[Result]) -> None:
    """The global set is every rank of the round; a set is usable once registered (the sets
    themselves: test_worker_process_sets.py)."""
    n = len(world)
    for r, got in enumerate(section(world, "process_set")):
        assert got["global_ranks"] == list(range(n))
        assert (got["global_size"], got["global_rank"], got["included"]) == (n, r, True)
        assert got["global_id"] == 0 and got["unregistered_id"] is None
        assert "is not registered in this round" in got["unregistered"]
        assert got["add_whole"].startswith("ValueError: Attempted to add a duplicate process")
        assert got["add_outside"].startswith("ValueError: ProcessSet(process_set_id=None")
        assert got["remove_global"] is False


def test_build_flags_and_adasum(world: list[Result]) -> None:
    for got in section(world, "capabilities"):
        assert got["mpi_built"] is got["mpi_enabled"] is got["mpi_threads_supported"] is False
        assert got["gloo_built"] is got["gloo_enabled"] is True
        assert got["nccl_built"] == 0 and got["cuda_built"] is False  # the CPU build of torch
        assert got["other_builds"] == [False, False, False]  # ROCm, DDL, oneCCL
        for key in ("adasum", "adasum_async"):
            assert got[key].startswith("NotImplementedError: op=Adasum"), got[key]
            assert "op=hvd.Average" in got[key]


def test_start_timeline_writes_a_chrome_trace_on_rank_0(world: list[Result]) -> None:
    infos = section(world, "timeline")
    path = Path(infos[0]["path"])
    events = json.loads(path.read_text())
    assert {e["pid"] for e in events} == {infos[0]["pid"]}, "only rank 0 writes the file"
    names = [e["name"] for e in events if e["cat"] == "collective"]
    assert names == ["allreduce", "synchronize", "barrier"]
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in events)


# ---- abort ----------------------------------------------------------------------------


def test_pending_handle_and_barrier_raise_promptly_when_a_peer_dies(tmp_path: Path) -> None:
    events, explain = run_abort_scenario(WORKER, tmp_path, ABORT_COLLECTIVE_TIMEOUT_S)
    (kill,) = [e for e in events if e["ev"] == "kill"]
    raised = {e["rank"]: e for e in events if e["ev"] == "raised"}
    assert {r: e["waiting_in"] for r, e in raised.items()} == {0: "barrier", 1: "synchronize"}
    for e in raised.values():
        assert e["time"] - kill["time"] < PROMPT_S, explain
    assert not [e for e in events if e["ev"] == "not_raised"], explain
    recovered = [e for e in events if e["ev"] == "recovered"]
    assert sorted(e["rank"] for e in recovered) == [0, 1], explain
    for e in recovered:
        assert e["size"] == 2 and e["round"] > kill["round"]
        assert e["total"] == 3.0 and e["last_joined"] in (0, 1)
    assert len({e["last_joined"] for e in recovered}) == 1
