"""Worker script of the name and mismatch tests: Horovod's matching of collectives by name.

Each rank writes to ``<out>/rank-<rank>.json``:

- ``duplicate``: Horovod's duplicate-name case. Rank 0 alone starts ``allreduce_async`` named
  ``dup`` and tries a second call of that name (refused); after a barrier the other ranks do
  the same; then every rank synchronizes its first call (the sum).
- ``crossed``: rank 0 starts ``a`` then ``b``, the others ``b`` then ``a``; both complete.
- ``repeated``: one name called again and again as a step loop does (the same call, then
  rows that change from step to step, then a dtype that changes on rank 0 alone): the sums
  and gathers of every step, and what the changed call raised.
- ``store_growth``: how many keys 80 collectives left in the round's store.
- ``mismatches``: by kind, what each rank's call raised (type and message) and the sum of an
  allreduce right after it, which shows the group still usable.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from api_worker import write_results  # beside this script

import elasticjob.worker_runtime as hvd
from elasticjob.worker_runtime.basics import current

GROWTH_ALLOWED = 2
"""The round's sequence counter, and a key another rank may be about to remove."""


def duplicate(rank: int, size: int) -> dict[str, Any]:
    tensor = torch.full((4,), float(rank + 1))
    refused: list[str] = []
    handle = None

    def start() -> int:
        first = hvd.allreduce_async(tensor, name="dup", op=hvd.Sum)
        try:
            hvd.allreduce_async(tensor, name="dup", op=hvd.Sum)
        except ValueError as exc:
            refused.append(str(exc))
        return first

    if rank == 0:
        handle = start()
    hvd.barrier()
    if rank > 0:
        handle = start()
    assert handle is not None
    total = hvd.synchronize(handle)
    hvd.barrier()
    return {"refused": refused, "sum": total.tolist()}


def crossed(rank: int) -> dict[str, Any]:
    a, b = torch.tensor([1.0 + rank]), torch.tensor([10.0 * (rank + 1)])
    if rank == 0:
        handles = [hvd.allreduce_async(a, name="a", op=hvd.Sum)]
        handles.append(hvd.allreduce_async(b, name="b", op=hvd.Sum))
    else:
        handles = [hvd.allreduce_async(b, name="b", op=hvd.Sum)]
        handles.insert(0, hvd.allreduce_async(a, name="a", op=hvd.Sum))
    return {"a": hvd.synchronize(handles[0]).item(), "b": hvd.synchronize(handles[1]).item()}


def repeated(rank: int, size: int) -> dict[str, Any]:
    sums = [hvd.allreduce(torch.tensor([float(step)]), name="loss", op=hvd.Sum).item()
            for step in range(5)]  # fmt: skip
    rows = [hvd.allgather(torch.full((rank + step, 2), float(rank)), name="rows").shape[0]
            for step in range(1, 4)]  # fmt: skip
    changed = torch.tensor([1.0]).int() if rank == 0 else torch.tensor([1.0])
    try:
        hvd.allreduce(changed, name="loss", op=hvd.Sum)
        raised = None
    except hvd.CollectiveMismatchError as exc:
        raised = str(exc)
    again = hvd.allreduce(torch.tensor([1.0]), name="loss", op=hvd.Sum).item()
    del size
    return {"sums": sums, "rows": rows, "raised": raised, "again": again}


def store_growth() -> int:
    """How many keys the round's store holds more after 80 collectives than before (each
    rank's negotiation removes its keys while the data moves: waited for, with a deadline)."""
    store = current().round_store
    assert store is not None
    before = store.num_keys()
    for _ in range(40):
        hvd.allreduce(torch.ones(1), name="grow")
        hvd.allreduce(torch.ones(1))
    hvd.barrier()
    deadline = time.monotonic() + 10
    while store.num_keys() - before > GROWTH_ALLOWED and time.monotonic() < deadline:
        time.sleep(0.05)
    growth = int(store.num_keys() - before)
    # No rank goes on to the next collective (whose keys the others would count) before every
    # rank has counted: torch's own barrier writes nothing to the round's store.
    dist.barrier()
    return growth


def mismatch_cases(rank: int) -> dict[str, Callable[[], Any]]:
    """Calls that differ between rank 0 and the others, by the mismatch they make."""
    first = rank == 0
    ones = torch.ones(2, 3)
    return {
        "dtype": lambda: hvd.allreduce(ones.int() if first else ones),
        "shape": lambda: hvd.allreduce(torch.ones(2, 3) if first else torch.ones(3, 2)),
        "op": lambda: hvd.allreduce(ones, op=hvd.Sum if first else hvd.Max),
        "prescale": lambda: hvd.allreduce(ones, prescale_factor=1.0 if first else 2.0),
        "postscale": lambda: hvd.allreduce(ones, postscale_factor=1.0 if first else 0.5),
        "root": lambda: hvd.broadcast(ones, root_rank=0 if first else 1),
        "operation": lambda: (
            hvd.allreduce(ones, name="x") if first else hvd.allgather(ones, name="x")
        ),
        "gather_shape": lambda: hvd.allgather(torch.ones(2, 3) if first else torch.ones(2, 4)),
        "gather_rank": lambda: hvd.allgather(torch.ones(2, 3) if first else torch.ones(2, 3, 1)),
        "alltoall_shape": lambda: hvd.alltoall(
            torch.ones(hvd.size(), 3) if first else torch.ones(hvd.size(), 2)
        ),
        "grouped_count": lambda: hvd.grouped_allreduce([ones] * (1 if first else 2)),
        "reducescatter_shape": lambda: hvd.reducescatter(
            torch.ones(hvd.size(), 3) if first else torch.ones(hvd.size(), 2)
        ),
    }


def mismatches(rank: int) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for kind, call in mismatch_cases(rank).items():
        try:
            call()
            raised = None
        except Exception as exc:  # any error: the test checks which it was
            raised = {"type": type(exc).__name__, "message": str(exc)}
        after = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum).item()
        found[kind] = {"raised": raised, "after": after}
    return found


def run() -> dict[str, Any]:
    """This rank's results (see the module docstring), from init to shutdown."""
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    results = {
        "rank": rank,
        "duplicate": duplicate(rank, size),
        "crossed": crossed(rank),
        "repeated": repeated(rank, size),
        "store_growth": store_growth(),
        "mismatches": mismatches(rank),
        "isinstance": issubclass(hvd.CollectiveMismatchError, RuntimeError),
    }
    hvd.shutdown()
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    results = run()
    write_results(parser.parse_args().out, results["rank"], results)


if __name__ == "__main__":
    main()
