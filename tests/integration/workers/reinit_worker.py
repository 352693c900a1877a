"""Worker script of the re-initialization test: ``init()`` after ``shutdown()``, twice, as a
Horovod script may do; writes to ``<out>/rank-<rank>.json`` what each initialization saw."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from api_worker import write_results  # beside this script

import elasticjob.worker_runtime as hvd


def observed() -> dict[str, Any]:
    """This initialization's place and a sum over every rank (each gives its rank + 1)."""
    summed = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    return {"rank": hvd.rank(), "size": hvd.size(), "sum": summed.item()}


def between() -> dict[str, Any]:
    """What a shut-down runtime answers."""
    try:
        hvd.rank()
    except ValueError as exc:
        return {"initialized": hvd.is_initialized(), "rank_error": str(exc)}
    return {"initialized": hvd.is_initialized(), "rank_error": None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    seen, gaps = [], []
    for _ in range(3):
        hvd.init()
        seen.append(observed())
        hvd.shutdown()
        gaps.append(between())
    write_results(args.out, seen[0]["rank"], {"seen": seen, "between": gaps})


if __name__ == "__main__":
    main()
