"""Worker script of the process-set tests: Horovod's process sets among the round's ranks.

The even ranks' set is registered by ``init(process_sets=...)``, the odd ranks' by
``add_process_set``. Each rank writes to ``<out>/rank-<rank>.json`` what its set's
collectives gave (both sets run theirs at once, with the same names), where a
``DistributedOptimizer`` over the even set took its parameter, the gradient of an
allreduce over its set, what was refused (a set's collective on a non-member, a duplicate
set, a removed set), and what became of the sets when ``init()`` after ``shutdown()`` formed
a new round: void until registered again.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

import torch
from api_worker import write_results  # beside this script

import elasticjob.worker_runtime as hvd


def refusal(call: Any) -> str | None:
    try:
        call()
    except (ValueError, NotImplementedError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def collectives(mine: hvd.ProcessSet, rank: int) -> dict[str, Any]:
    """Every collective over ``mine``, named alike in both sets."""
    value = torch.tensor([float(rank + 1)], requires_grad=True)
    summed = hvd.allreduce(value, name="sum", op=hvd.Sum, process_set=mine)
    summed.backward()
    root = mine.ranks[-1]
    size = mine.size()
    assert size is not None
    rows = hvd.allgather(torch.full((rank + 1, 2), float(rank)), name="rows", process_set=mine)
    handle = hvd.allreduce_async(torch.tensor([float(rank)]), name="mean", process_set=mine)
    scattered = hvd.reducescatter(
        torch.arange(2 * size, dtype=torch.float32) * (rank + 1), op=hvd.Sum, process_set=mine
    )
    exchanged = hvd.alltoall(torch.full((size,), float(rank)), process_set=mine)
    grouped = hvd.grouped_allreduce(
        [torch.ones(2), torch.ones(3, dtype=torch.int64)], op=hvd.Sum, process_set=mine
    )
    hvd.barrier(process_set=mine)
    return {
        "id": mine.process_set_id,
        "ranks": mine.ranks,
        "size": size,
        "set_rank": mine.rank(),
        "str": str(mine),
        "sum": summed.item(),
        "grad": value.grad.item() if value.grad is not None else None,
        "rows": rows[:, 0].tolist(),
        "mean": hvd.synchronize(handle).item(),
        "broadcast": hvd.broadcast(torch.tensor([float(rank)]), root, process_set=mine).item(),
        "scattered": scattered.tolist(),
        "exchanged": exchanged.tolist(),
        "grouped": [t.tolist() for t in grouped],
        "object": hvd.broadcast_object({"from": rank}, root, process_set=mine),
        "objects": hvd.allgather_object(f"rank {rank}", process_set=mine),
    }


def optimizer_step(process_set: hvd.ProcessSet, rank: int) -> float:
    """One SGD step (lr 1) of a ``DistributedOptimizer`` over ``process_set``, built on every
    rank, from 0 on the gradient ``(rank + 1) ** 2``: the parameter it ends at."""
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD([param], lr=1.0), named_parameters=[("p", param)], process_set=process_set
    )
    (param * float((rank + 1) ** 2)).sum().backward()
    optimizer.step()
    return param.item()


def run() -> dict[str, Any]:
    """This rank's results (see the module docstring), from init to shutdown."""
    even = hvd.ProcessSet(range(0, int(os.environ["HOROVOD_SIZE"]), 2))  # set at start
    hvd.init(process_sets=[even])
    rank, size = hvd.rank(), hvd.size()
    odd = hvd.add_process_set([r for r in range(size) if r % 2])
    mine, other = (even, odd) if rank % 2 == 0 else (odd, even)
    results: dict[str, Any] = {"rank": rank, "global_str": str(hvd.global_process_set)}
    results["collectives"] = collectives(mine, rank)
    results["optimizer_over_even"] = optimizer_step(even, rank)
    results["not_a_member"] = refusal(lambda: hvd.allreduce(torch.ones(1), process_set=other))
    results["duplicate"] = refusal(lambda: hvd.add_process_set(list(even.ranks)))
    results["removed"] = hvd.remove_process_set(odd)
    results["after_removal"] = refusal(
        lambda: hvd.allreduce(torch.ones(1), process_set=odd) if rank % 2 else None
    )
    results["global_removed"] = hvd.remove_process_set(hvd.global_process_set)
    hvd.shutdown()
    hvd.init()  # a new round's group: every set but the global one is void
    results["void_id"] = even.process_set_id
    results["void"] = refusal(
        lambda: hvd.allreduce(torch.ones(1), process_set=even) if rank % 2 == 0 else None
    )
    hvd.add_process_set(even)
    results["again"] = (
        hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=even).item() if rank % 2 == 0 else None
    )
    hvd.shutdown()
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    results = run()
    write_results(parser.parse_args().out, results["rank"], results)


if __name__ == "__main__":
    main()
