"""Every collective on every dtype Horovod takes on the CPU, over 2 and 3 real processes.

``workers/dtypes_worker.py`` runs in the worker-API suite's launcher job (Gloo on loopback hosts)
and writes, by dtype and case, each rank's inputs and results; here the expected results are
computed from every rank's inputs with plain tensor arithmetic in the same dtype: a dtype Gloo lacks
(``int16``) must come back bit for bit, integer averages and scaled reductions truncate toward zero
as Horovod's do, booleans reduce as logical or (sum, max) and and (min).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

from tests.support.worker_scripts import api_suite_part

pytestmark = pytest.mark.integration

DTYPES = {
    str(dtype): dtype
    for dtype in (
        *(torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64),
        *(torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool),
    )
}
Json = dict[str, Any]


@pytest.fixture(scope="module", params=[2, 3], ids=["2 processes", "3 processes"])
def ranks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> list[Json]:
    return api_suite_part("dtypes", request.param, tmp_path_factory)


def tensor(found: Json) -> torch.Tensor:
    """A tensor back from its JSON form (exactly)."""
    dtype = DTYPES[found["dtype"]]
    return torch.tensor(found["values"], dtype=torch.float64).to(dtype).reshape(found["shape"])


def same(found: Json, expected: torch.Tensor) -> None:
    got = tensor(found)
    assert got.dtype == expected.dtype, (got, expected)
    assert torch.equal(got, expected), (got, expected)


def scale(value: torch.Tensor, factor: float) -> torch.Tensor:
    """Horovod's scaling: in the dtype for floats; in double, truncated, for integers."""
    if value.is_floating_point():
        return value * factor
    return torch.trunc(value.to(torch.float64) * factor).to(value.dtype)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_every_collective_on_every_dtype(ranks: list[Json], dtype: str) -> None:
    size = len(ranks)
    inputs = [{k: tensor(v) for k, v in r[dtype]["inputs"].items()} for r in ranks]
    mine = [i["mine"] for i in inputs]
    total = functools.reduce(torch.add, mine)
    root = inputs[-1]
    for rank, result in enumerate(r[dtype] for r in ranks):
        same(result["allreduce_sum"], total)
        same(result["allreduce_min"], functools.reduce(torch.minimum, mine))
        same(result["allreduce_max"], functools.reduce(torch.maximum, mine))
        if dtype != "torch.bool":
            average = scale(total, 1 / size)
            same(result["allreduce_average"], average)
            same(result["allreduce_in_place_average"], average)
            scaled = scale(functools.reduce(torch.add, [scale(m, 0.5) for m in mine]), 3.0)
            same(result["allreduce_scaled"], scaled)
            same(result["allreduce_product"], functools.reduce(torch.mul, [m[:, :1] for m in mine]))
            grouped = result["grouped_allreduce_sum"]
            same(grouped[0], total)
            same(grouped[1], functools.reduce(torch.add, [m[:1] * 2 for m in mine]))
            rows = functools.reduce(torch.add, [i["one_per_rank"] for i in inputs])
            same(result["reducescatter_sum"], rows[rank : rank + 1])
        gathered = torch.cat([i["own_rows"] for i in inputs])
        same(result["allgather"], gathered)
        same(result["grouped_allgather"][0], torch.cat(mine))
        same(result["grouped_allgather"][1], gathered)
        for case in ("broadcast", "broadcast_in_place", "broadcast_parameters"):
            same(result[case], root["mine"])
        same(result["alltoall"], torch.cat([i["one_per_rank"][rank : rank + 1] for i in inputs]))
