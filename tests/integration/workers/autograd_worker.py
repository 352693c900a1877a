"""Worker script of the autograd tests: a loss computed from each collective's output
back-propagates through it. For each case every rank writes its input, the weights of its
loss ``(output * weights).sum()`` (one per output) and the gradient it got, to
``<out>/rank-<rank>.json``; the test computes Horovod's gradients from every rank's values.
Values are small multiples of a half, so every sum is exact (in float16 too)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from api_worker import write_results  # beside this script

import elasticjob.worker_runtime as hvd

Case = Callable[[torch.Tensor], Sequence[torch.Tensor]]


def ranked(rank: int, rows: int, salt: float = 0.0) -> torch.Tensor:
    """``rows`` x 3 values of ``rank``, halves."""
    return (torch.arange(rows * 3, dtype=torch.float64).reshape(rows, 3) + rank + salt) / 2


def weights_of(rank: int, output: int, shape: torch.Size) -> torch.Tensor:
    """The weights of ``rank``'s loss on its ``output``-th output, halves."""
    count = shape.numel()
    values = torch.arange(count, dtype=torch.float64) + rank + 1 + 0.5 * output
    return values.reshape(shape) / 2


def run_case(rank: int, rows: int, case: Case) -> dict[str, Any]:
    x = ranked(rank, rows).requires_grad_(True)
    outputs = case(x)
    weights = [weights_of(rank, i, o.shape) for i, o in enumerate(outputs)]
    loss = sum(((o * w).sum() for o, w in zip(outputs, weights, strict=True)), torch.zeros(()))
    loss.backward()
    assert x.grad is not None
    return {
        "x": x.detach().tolist(),
        "weights": [w.tolist() for w in weights],
        "shapes": [list(o.shape) for o in outputs],
        "grad": x.grad.tolist(),
    }


def cases(rank: int, size: int) -> dict[str, Any]:
    last = size - 1
    table: dict[str, tuple[int, Case]] = {
        "allreduce_sum": (2, lambda x: [hvd.allreduce(x, op=hvd.Sum)]),
        "allreduce_average": (2, lambda x: [hvd.allreduce(x)]),
        "allreduce_scaled": (
            2,
            lambda x: [hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)],
        ),
        "allreduce_fp16": (2, lambda x: [hvd.allreduce(x, compression=hvd.Compression.fp16)]),
        "grouped_allreduce": (2, lambda x: hvd.grouped_allreduce([x, 2 * x], op=hvd.Sum)),
        "allgather": (rank + 1, lambda x: [hvd.allgather(x)]),
        "grouped_allgather": (rank + 1, lambda x: hvd.grouped_allgather([x, 3 * x])),
        "broadcast": (2, lambda x: [hvd.broadcast(x, root_rank=last)]),
        "alltoall": (size, lambda x: [hvd.alltoall(x)]),
        "alltoall_splits": (size, lambda x: [hvd.alltoall(x, splits=[1] * size)[0]]),
        "reducescatter_sum": (size, lambda x: [hvd.reducescatter(x, op=hvd.Sum)]),
        "reducescatter_average": (size, lambda x: [hvd.reducescatter(x)]),
        "grouped_reducescatter": (
            size,
            lambda x: hvd.grouped_reducescatter([x, 2 * x], op=hvd.Sum, postscale_factor=0.5),
        ),
    }
    return {name: run_case(rank, rows, case) for name, (rows, case) in table.items()}


def grouped_outputs_alone() -> list[list[float]]:
    """A grouped allreduce's outputs backpropagated one at a time (as Horovod's tests do):
    the gradients of its two leaf inputs."""
    a, b = (torch.ones(2, dtype=torch.float64, requires_grad=True) for _ in range(2))
    first, second = hvd.grouped_allreduce([a, b], op=hvd.Sum)
    first.sum().backward()
    second.sum().backward()
    assert a.grad is not None and b.grad is not None
    return [a.grad.tolist(), b.grad.tolist()]


def run() -> dict[str, Any]:
    """This rank's results (see the module docstring), from init to shutdown."""
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    with torch.no_grad():  # outside autograd, nothing is tracked
        plain = hvd.allreduce(torch.ones(2, requires_grad=True))
    results = {"rank": rank, "size": size, "cases": cases(rank, size)}
    results["grouped_outputs_alone"] = grouped_outputs_alone()
    results["no_grad_output_tracked"] = plain.requires_grad
    hvd.shutdown()
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    results = run()
    write_results(parser.parse_args().out, results["rank"], results)


if __name__ == "__main__":
    main()
