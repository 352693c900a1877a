"""A training script that fails on its own (``test_broken_scripts.py``): it raises
``ValueError("broken on purpose ...")`` on rank 0 (``--raise-on rank-0``) or on every rank
(``every-rank``) at a step, in every round (``--at-step`` on, a script that is broken) or once
per step of ``--once-at`` (a crash now and then, with commits between). It commits after every
step and logs a ``start`` event per round and a ``step`` event per step."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

import elasticjob.worker_runtime as hvd


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--raise-on", choices=["rank-0", "every-rank"], default="rank-0")
    parser.add_argument("--at-step", type=int, help="raise whenever this step is reached")
    parser.add_argument(
        "--once-at", type=int, action="append", default=[], help="raise once at this step"
    )
    parser.add_argument("--steps", type=int, default=12)
    return parser.parse_args()


def log(log_dir: Path, event: str, **fields: Any) -> None:
    log_dir.mkdir(parents=True, exist_ok=True)
    with (log_dir / f"events-{os.getpid()}.jsonl").open("a") as f:
        f.write(json.dumps({"ev": event, "pid": os.getpid(), "time": time.time(), **fields}))
        f.write("\n")


def raises_now(args: argparse.Namespace, step: int) -> bool:
    """Whether this rank raises at ``step``: a ``--once-at`` step raises in the first round
    that reaches it only (a marker file remembers it)."""
    if args.raise_on == "rank-0" and hvd.rank() != 0:
        return False
    if step == args.at_step:
        return True
    marker = args.log_dir / f"raised-at-{step}"
    if step in args.once_at and not marker.exists():
        marker.touch()
        return True
    return False


def main() -> None:
    args = parse_args()
    hvd.init()
    model = torch.nn.Linear(4, 1)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
    )
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        log(args.log_dir, "start", round=hvd.current_round(), rank=hvd.rank(), size=hvd.size())
        while state.step < args.steps:
            if raises_now(args, state.step):
                raise ValueError(f"broken on purpose at step {state.step} on rank {hvd.rank()}")
            optimizer.zero_grad()
            model(torch.ones(2, 4)).sum().backward()
            optimizer.step()
            state.step += 1
            log(args.log_dir, "step", round=hvd.current_round(), rank=hvd.rank(), step=state.step)
            state.commit()

    train(state)


if __name__ == "__main__":
    main()
