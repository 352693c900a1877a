"""Gradients flow through Horovod's collectives, as Horovod defines them, over 2 and 3 real
processes (``workers/autograd_worker.py``, in the worker-API suite's launcher job on loopback
hosts).

Every rank's loss is ``(output * weights).sum()`` over the collective's outputs; its
gradient with respect to the rank's input is compared, exactly (values are halves), with
Horovod's: an allreduce's gradient is the same allreduce of the weights; an allgather's the
average of the weights, this rank's rows; a broadcast's the average on the root and zero
elsewhere; an alltoall's the weights sent back; a reduce-scatter's the weights gathered
(times the number of ranks for a sum, and the scale factors). Outside autograd nothing is
tracked.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from tests.support.worker_scripts import api_suite_part

pytestmark = pytest.mark.integration

Json = dict[str, Any]


@pytest.fixture(scope="module", params=[2, 3], ids=["2 processes", "3 processes"])
def ranks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[Json]:
    return api_suite_part("autograd", request.param, tmp_path_factory)


def weights(ranks: list[Json], case: str, output: int = 0) -> list[torch.Tensor]:
    """Every rank's weights on the ``output``-th output of ``case``."""
    return [torch.tensor(r["cases"][case]["weights"][output], dtype=torch.float64) for r in ranks]


def summed(tensors: list[torch.Tensor]) -> torch.Tensor:
    return functools.reduce(torch.add, tensors)


def rows_of(ranks: list[Json], case: str) -> list[int]:
    return [len(r["cases"][case]["x"]) for r in ranks]


def own_rows(total: torch.Tensor, rows: list[int], rank: int) -> torch.Tensor:
    start = sum(rows[:rank])
    return total[start : start + rows[rank]]


def expected(ranks: list[Json], case: str, rank: int) -> torch.Tensor:
    """Horovod's gradient of ``rank``'s input in ``case``."""
    n = len(ranks)
    w = weights(ranks, case)
    if case == "allreduce_sum":
        return summed(w)
    if case == "allreduce_average":
        return summed(w) / n
    if case == "allreduce_scaled":
        return summed([0.5 * x for x in w]) * 3.0
    if case == "allreduce_fp16":
        return (summed([x.half() for x in w]) * (1 / n)).double()
    if case == "grouped_allreduce":
        return summed(w) + 2 * summed(weights(ranks, case, 1))
    if case in ("allgather", "grouped_allgather"):
        rows = rows_of(ranks, case)
        grad = own_rows(summed(w) / n, rows, rank)
        if case == "grouped_allgather":
            grad = grad + 3 * own_rows(summed(weights(ranks, case, 1)) / n, rows, rank)
        return grad
    if case == "broadcast":
        return summed(w) / n if rank == n - 1 else torch.zeros_like(w[0])
    if case in ("alltoall", "alltoall_splits"):
        return torch.cat([w[j][rank : rank + 1] for j in range(n)])
    if case == "reducescatter_sum":
        return torch.cat(w) * n
    if case == "reducescatter_average":
        return torch.cat(w)
    if case == "grouped_reducescatter":
        scale = n * 0.5
        return torch.cat(w) * scale + 2 * torch.cat(weights(ranks, case, 1)) * scale
    raise AssertionError(case)


CASES = [
    "allreduce_sum",
    "allreduce_average",
    "allreduce_scaled",
    "allreduce_fp16",
    "grouped_allreduce",
    "allgather",
    "grouped_allgather",
    "broadcast",
    "alltoall",
    "alltoall_splits",
    "reducescatter_sum",
    "reducescatter_average",
    "grouped_reducescatter",
]


@pytest.mark.parametrize("case", CASES)
def test_gradients_flow_through_the_collective(ranks: list[Json], case: str) -> None:
    for rank, result in enumerate(ranks):
        got = torch.tensor(result["cases"][case]["grad"], dtype=torch.float64)
        want = expected(ranks, case, rank)
        assert torch.equal(got, want), (case, rank, got, want)


def test_outside_autograd_nothing_is_tracked(ranks: list[Json]) -> None:
    assert all(r["no_grad_output_tracked"] is False for r in ranks)


def test_a_grouped_operations_outputs_can_be_backpropagated_one_at_a_time(
    ranks: list[Json],
) -> None:
    """Its second output's backward used to fail ("backward through the graph a second
    time": the operation saved its outputs whether or not it had any to save)."""
    n = len(ranks)
    assert all(r["grouped_outputs_alone"] == [[float(n)] * 2] * 2 for r in ranks)
