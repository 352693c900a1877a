"""Worker script that runs the worker-API scripts beside it in one launcher job: each part's
``run()`` (its own init to shutdown, in turn, in one process per rank) and writes
``<out>/rank-<rank>.json`` as ``{part: results}``. One job of 2 and one of 3 processes serve
the name, dtype, autograd and process-set tests, and the 3-process job the API, collective
and optimizer tests too, instead of a job per module and size."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from typing import Any

from api_worker import write_results  # beside this script

FIRST = "process_sets"
"""The part that runs first, as it starts with sets at ``init``."""
WRITES_TO_OUT = {"collectives"}
"""The parts whose ``run(out)`` writes files of their own to ``--out`` (a timeline)."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--parts", required=True, help="comma-separated, in the order to run")
    args = parser.parse_args()
    parts = args.parts.split(",")
    if FIRST in parts and parts[0] != FIRST:
        parser.error(f"{FIRST} must come first")
    results: dict[str, Any] = {}
    for part in parts:
        module = importlib.import_module(f"{part}_worker")
        results[part] = module.run(args.out) if part in WRITES_TO_OUT else module.run()
    write_results(args.out, results["names"]["rank"], results)


if __name__ == "__main__":
    main()
