"""Worker of the recovery benchmark: an MLP on random data (~5M parameters, or a small one),
commit every 5 steps, one timestamped event per completed step, per scripted kill and per log
record of the worker runtime (its aborts, joins and syncs) in a JSON-lines file."""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch

import elasticjob.worker_runtime as hvd
from elasticjob.worker_contract import ENV_HOSTNAME, ENV_LOCAL_RANK


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--commit-every", type=int, default=5)
    parser.add_argument("--kill-at", type=int, default=-1, help="--kill-rank SIGKILLs itself here")
    parser.add_argument("--kill-rank", type=int, default=3)
    parser.add_argument("--small", action="store_true", help="a ~70k-parameter MLP instead")
    parser.add_argument(
        "--steps-after-change", type=int, default=0, help="end this many steps into round 2"
    )
    parser.add_argument("--join-file", type=Path, help="rank 0 writes the step it is at here")
    parser.add_argument("--steady", type=int, default=0, help="steps per block of the A/B run")
    return parser.parse_args()


def relu_mlp(*widths: int) -> torch.nn.Sequential:
    """Linear layers of these widths with ReLUs between them, the same weights on every rank
    (seed 0)."""
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [torch.nn.Linear(a, b), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


class EventLog(logging.Handler):
    """Every log record of the worker runtime as a timestamped event of the JSON-lines file."""

    def __init__(self, write: Any) -> None:
        super().__init__()
        self.write = write

    def emit(self, record: logging.LogRecord) -> None:
        self.write(json.dumps({"ev": "log", "t": record.created, "pid": os.getpid(),
                               "msg": record.getMessage()}) + "\n")  # fmt: skip


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    hvd.init()
    args.log_dir.mkdir(parents=True, exist_ok=True)
    out = (args.log_dir / f"{os.getpid()}.jsonl").open("a", buffering=1)
    logging.getLogger("elasticjob").addHandler(EventLog(out.write))

    def log(event: str, **fields: Any) -> None:
        out.write(json.dumps({"ev": event, "t": time.time(), "pid": os.getpid(), **fields}) + "\n")

    # 5 M parameters, or a small model (66 k) for the world-size sweep
    model = relu_mlp(1024, 64, 10) if args.small else relu_mlp(1024, 2048, 1024, 512, 10)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9))
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)
    x = torch.randn(args.batch_size, 1024)
    y = torch.randint(0, 10, (args.batch_size,))

    def step() -> None:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    if args.steady:
        steady_ab(args.steady, step, state, log)
        return

    round_2_from: list[int] = []  # the step at which round 2 started (same on every rank)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.step < args.steps:
            if args.steps_after_change and hvd.current_round() >= 2:
                round_2_from.append(state.step)
                if state.step >= round_2_from[0] + args.steps_after_change:
                    break
            dies = hvd.rank() == args.kill_rank and hvd.current_round() == 1
            if state.step == args.kill_at and dies:
                worker = f"{os.environ[ENV_HOSTNAME]}[{os.environ[ENV_LOCAL_RANK]}]"
                log("kill", step=state.step, worker=worker)
                out.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            step()
            state.step += 1
            log(
                "step", step=state.step, rank=hvd.rank(), size=hvd.size(), round=hvd.current_round()
            )
            if hvd.rank() == 0 and args.join_file is not None:
                args.join_file.write_text(str(state.step))
            if state.step % args.commit_every == 0:
                state.commit()
            else:
                state.check_host_updates()

    train(state)
    hvd.shutdown()


def steady_ab(block: int, step: Any, state: hvd.elastic.TorchState, log: Any) -> None:
    """Alternate blocks of the same loop with and without the per-step host-update check, so
    both see the same machine load; rank 0 logs each block's mean step time."""
    for _ in range(3):
        step()  # warm up
    for repeat in range(6):
        for elastic in (repeat % 2 == 0, repeat % 2 == 1):
            hvd.allreduce(torch.zeros(1))  # align ranks before timing
            started = time.perf_counter()
            for _ in range(block):
                step()
                if elastic:
                    state.check_host_updates()
            seconds = (time.perf_counter() - started) / block
            if hvd.rank() == 0:
                log("block", elastic=elastic, step_s=seconds)


if __name__ == "__main__":
    main()
