"""Worker of the negotiation benchmark: blocks of blocking allreduces of one size, matched
by name (``hvd.allreduce_``, negotiated through the round's store: unnamed, and named the same
every time) and matched by order (the same reduction issued straight on the round's group, as
the runtime's internal collectives are), in rotating order; rank 0 writes one JSON line per
block to ``<out>/blocks.jsonl``."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import elasticjob.worker_runtime as hvd
from elasticjob.worker_runtime.basics import current
from elasticjob.worker_runtime.collectives.issuing import start_allreduce_


def by_order(tensor: torch.Tensor) -> torch.Tensor:
    pending = start_allreduce_(tensor, op=hvd.Sum)
    current().group.wait(pending.work)
    return pending.finish()


def unnamed(tensor: torch.Tensor) -> torch.Tensor:
    return hvd.allreduce_(tensor, op=hvd.Sum)


def named(tensor: torch.Tensor) -> torch.Tensor:
    """The same call of one name every time: agreed on from a count alone."""
    return hvd.allreduce_(tensor, name="metric", op=hvd.Sum)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sizes", type=int, nargs="+", required=True)
    parser.add_argument("--calls", type=int, default=50, help="allreduces per block")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    variants = {"order": by_order, "unnamed": unnamed, "named": named}
    lines = []
    for repeat in range(args.repeats):
        for size in args.sizes:
            tensor = torch.ones(size)
            shift = repeat % len(variants)
            names = [*list(variants)[shift:], *list(variants)[:shift]]
            for variant in names:
                reduce = variants[variant]
                reduce(tensor)  # warm
                hvd.barrier()
                started = time.perf_counter()
                for _ in range(args.calls):
                    reduce(tensor)
                elapsed = time.perf_counter() - started
                lines.append(
                    {"repeat": repeat, "size": size, "variant": variant,
                     "call_s": elapsed / args.calls}
                )  # fmt: skip
    if hvd.rank() == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        text = "".join(json.dumps(line) + "\n" for line in lines)
        (args.out / "blocks.jsonl").write_text(text)
    hvd.shutdown()


if __name__ == "__main__":
    main()
