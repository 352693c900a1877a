"""DistributedOptimizer across real processes: reductions launched from backward hooks while
backward runs, results equal to averaging at the step, Horovod's skip_synchronize,
backward_passes_per_step, groups, step weights, None and sparse gradients, GradScaler with an
inf on one rank, and the abort when a peer is SIGKILLed in the middle of a backward pass.

``optimizer_worker.py``'s ``run`` in the worker-API suite's 3-process Gloo job on the
loopback hosts of ``test_worker_api.py``; every rank writes what it observed, the tests
assert on it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.worker_scripts import (
    Result,
    api_suite_part,
    run_abort_scenario,
    same_everywhere,
    section,
)

pytestmark = pytest.mark.integration

WORKER = Path(__file__).parent / "workers" / "optimizer_worker.py"
ABORT_COLLECTIVE_TIMEOUT_S = 60
"""The abort test's collective timeout: a raise must come well before it."""
PROMPT_S = 10.0
"""How soon after the kill the survivors must raise."""
EXACT = 1e-5


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> list[Result]:
    """Every rank's results from the worker-API suite's 3-process job on two hosts."""
    return api_suite_part("optimizer", 3, tmp_path_factory)


def test_reductions_start_during_backward_and_step_adds_none(cluster: list[Result]) -> None:
    for got in section(cluster, "overlap"):
        assert got["buckets"] == 6
        (at_probe,) = got["launched_at_probe"]
        assert 1 <= at_probe < 6, "the last layers' buckets leave before the first layer's"
        assert got["launched_by_end_of_backward"] == 6
        assert got["launched_by_step"] == 0


@pytest.mark.parametrize(
    "layout", ["default", "one_bucket_per_parameter", "num_groups", "groups", "predivide"]
)
def test_equal_to_averaging_at_the_step(cluster: list[Result], layout: str) -> None:
    got = [g[layout] for g in section(cluster, "equality")]
    same_everywhere([g["params"] for g in got])
    for g in got:
        assert g["max_diff"] < EXACT, g
        assert g["moved"] > 1e-2


def test_skip_synchronize_after_synchronize(cluster: list[Result]) -> None:
    for got in section(cluster, "clipping"):
        skip, plain = got["skip_synchronize"], got["plain_step"]
        for variant in (skip, plain):
            assert variant["max_diff"] < EXACT, variant
            assert variant["moved"] > 1e-3
            assert variant["launched_by_step"] == [0, 0], "the step reduced again"
        assert skip["warnings"] == []
        assert len(plain["warnings"]) == 2
        assert all("skip_synchronize" in w for w in plain["warnings"])


def test_backward_passes_per_step_reduces_once_per_step(cluster: list[Result]) -> None:
    for got in section(cluster, "accumulation"):
        n = got["buckets"]
        assert got["launched_after_each_pass"] == [[0, 0, n], [0, 0, n]]
        assert got["max_diff"] < EXACT, got
        assert got["moved"] > 1e-2
        assert "between the backward passes" in got["zero_grad_between"]


def test_step_weights_give_the_weighted_average(cluster: list[Result]) -> None:
    got = section(cluster, "weighted")
    same_everywhere([g["params"] for g in got])
    for g in got:
        assert g["max_diff"] < EXACT, g


def test_gradients_none_on_some_ranks_are_reduced_as_zeros(cluster: list[Result]) -> None:
    got = section(cluster, "none_grads")
    same_everywhere([g["params"] for g in got])
    for g in got:
        assert g["max_diff"] < EXACT, g
        assert g["branch_moved"] > 1e-3, "rank 1's gradient reached every rank"
        assert g["branch_grad_nonzero"] is True
        assert g["unused_moved"] == 0.0


def test_sparse_gradients_are_reduced_densely_with_a_warning(cluster: list[Result]) -> None:
    got = section(cluster, "sparse")
    same_everywhere([g["params"] for g in got])
    for g in got:
        assert g["max_diff"] < EXACT, g
        assert g["grad_is_sparse"] is True
        assert [w for w in g["warnings"] if "sparse gradients as dense" in w], g["warnings"]


@pytest.mark.parametrize("variant", ["recipe", "plain"])
def test_grad_scaler_with_an_inf_on_one_rank_skips_everywhere(
    cluster: list[Result], variant: str
) -> None:
    got = [g[variant] for g in section(cluster, "amp")]
    scales = same_everywhere([g["scales"] for g in got])
    assert scales == [2048.0, 1024.0, 2048.0, 4096.0], "step 1 skipped, the others taken"
    digests = same_everywhere([g["digests"] for g in got])
    assert digests[1] == digests[0] and len(set(digests)) == 3
    for g in got:
        assert g["finite"] is True


# ---- abort ----------------------------------------------------------------------------


def test_a_peer_killed_mid_backward_fails_the_survivors_promptly(tmp_path: Path) -> None:
    events, explain = run_abort_scenario(WORKER, tmp_path, ABORT_COLLECTIVE_TIMEOUT_S)
    (kill,) = [e for e in events if e["ev"] == "kill"]
    raised = [e for e in events if e["ev"] == "raised"]
    assert sorted(e["rank"] for e in raised) == [0, 1], explain
    for e in raised:
        assert e["waiting_in"] == "backward", explain
        assert e["time"] - kill["time"] < PROMPT_S, explain
    done = [e for e in events if e["ev"] == "done"]
    assert [(e["size"], e["step"]) for e in done] == [(2, 6), (2, 6)], explain
    assert done[0]["params"] == done[1]["params"], explain
    assert all(e["round"] > kill["round"] for e in done)
