"""Worker script that runs the worker-API scripts beside it in one launcher job: each part's
``run()`` (its own init to shutdown, in turn, in one process per rank) and writes
``<out>/rank-<rank>.json`` as ``{part: results}``. One job of 2 and one of 3 processes serve
the name, dtype, autograd and process-set tests instead of a job per module and size."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

from api_worker import write_results  # beside this script

PARTS = ("process_sets", "names", "dtypes", "autograd")
"""In the order they run: the process-set part first, as it starts with sets at ``init``."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    results: dict[str, Any] = {}
    for part in PARTS:
        results[part] = importlib.import_module(f"{part}_worker").run()
    write_results(args.out, results["names"]["rank"], results)


if __name__ == "__main__":
    main()
