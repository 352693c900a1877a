"""Worker script of the dtype tests: every collective on every dtype Horovod takes on the CPU.

Each rank writes to ``<out>/rank-<rank>.json``, by dtype and case, its input and what the
collective gave it (values exactly: floats as float64, which holds every float16 and
bfloat16 value), so the test computes the expected results from every rank's inputs.
Inputs are small integers (negative ones for signed dtypes), so every sum and product is
exact in every dtype and an integer average must truncate toward zero as Horovod's does.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from api_worker import write_results  # beside this script

import elasticjob.worker_runtime as hvd

DTYPES = (
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.bool,
)
REDUCTIONS = {"sum": hvd.Sum, "average": hvd.Average, "min": hvd.Min, "max": hvd.Max}


def values(tensor: torch.Tensor) -> dict[str, Any]:
    """A tensor as JSON: its dtype, shape and exact values."""
    exact = tensor if not tensor.is_floating_point() else tensor.to(torch.float64)
    return {"dtype": str(tensor.dtype), "shape": list(tensor.shape), "values": exact.tolist()}


def rank_input(dtype: torch.dtype, rank: int, rows: int = 2) -> torch.Tensor:
    """``rows`` x 3 small integers of ``rank`` (negative ones for signed dtypes)."""
    base = torch.arange(rows * 3, dtype=torch.int64).reshape(rows, 3) + 2 * rank + 1
    if dtype == torch.bool:
        return (base % 2).to(torch.bool)
    signed = dtype.is_floating_point or dtype.is_signed
    sign = torch.tensor([1, -1, 1]) if signed else torch.ones(3, dtype=torch.int64)
    return (base * sign).to(dtype)


def cases(dtype: torch.dtype, rank: int, size: int) -> dict[str, Any]:
    mine = rank_input(dtype, rank)
    one_per_rank, own_rows = rank_input(dtype, rank, size), rank_input(dtype, rank, rank + 1)
    out: dict[str, Any] = {
        "inputs": {
            "mine": values(mine),
            "one_per_rank": values(one_per_rank),
            "own_rows": values(own_rows),
        }
    }
    names = ("sum", "min", "max") if dtype == torch.bool else tuple(REDUCTIONS)
    for name in names:
        out[f"allreduce_{name}"] = values(hvd.allreduce(mine, op=REDUCTIONS[name]))
    if dtype != torch.bool:
        scaled = hvd.allreduce(mine, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
        out["allreduce_scaled"] = values(scaled)
        out["allreduce_product"] = values(hvd.allreduce(mine[:, :1], op=hvd.Product))
        in_place = mine.clone()
        hvd.allreduce_(in_place, op=hvd.Average)
        out["allreduce_in_place_average"] = values(in_place)
        grouped = hvd.grouped_allreduce([mine, mine[:1] * 2], op=hvd.Sum)
        out["grouped_allreduce_sum"] = [values(t) for t in grouped]
        out["reducescatter_sum"] = values(hvd.reducescatter(one_per_rank, op=hvd.Sum))
    out["allgather"] = values(hvd.allgather(own_rows))
    out["grouped_allgather"] = [values(t) for t in hvd.grouped_allgather([mine, own_rows])]
    out["broadcast"] = values(hvd.broadcast(mine, root_rank=size - 1))
    in_place = mine.clone()
    hvd.broadcast_(in_place, root_rank=size - 1)
    out["broadcast_in_place"] = values(in_place)
    out["alltoall"] = values(hvd.alltoall(one_per_rank))
    parameters = {"weight": mine.clone()}
    hvd.broadcast_parameters(parameters, root_rank=size - 1)
    out["broadcast_parameters"] = values(parameters["weight"])
    return out


def run() -> dict[str, Any]:
    """This rank's results (see the module docstring), from init to shutdown."""
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    results = {"rank": rank, "size": size}
    results |= {str(dtype): cases(dtype, rank, size) for dtype in DTYPES}
    hvd.shutdown()
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    results = run()
    write_results(parser.parse_args().out, results["rank"], results)


if __name__ == "__main__":
    main()
