"""Worker of the optimizer benchmark: a ~25M-parameter MLP trained in alternating blocks of
steps by torch's DistributedDataParallel, by ``hvd.DistributedOptimizer``, and by
``hvd.DistributedOptimizer`` with ``check_host_updates()`` after every step; rank 0 writes
one JSON line per block (its mean step time) to ``<out>/blocks.jsonl``."""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
from bench_worker import relu_mlp  # beside this script (run by path)
from torch.nn.parallel import DistributedDataParallel

import elasticjob.worker_runtime as hvd
from elasticjob.worker_runtime.basics import current
from elasticjob.worker_runtime.training.gradient_reducer import GradientReducer

VARIANTS = ("ddp", "optimizer", "optimizer_check")


def instrument(cls: type, name: str, phase: str, phases: dict[str, float]) -> None:
    """Add the time spent in ``cls.name`` to ``phases[phase]``."""
    original = getattr(cls, name)

    def timed(*args: object, **kwargs: object) -> object:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            phases[phase] += time.perf_counter() - started

    setattr(cls, name, timed)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per block")
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    base = relu_mlp(1024, 4096, 4096, 1024, 10)  # 25 M parameters
    x = torch.randn(args.batch_size, 1024)
    y = torch.randint(0, 10, (args.batch_size,))

    ddp_model = copy.deepcopy(base)
    ddp = DistributedDataParallel(ddp_model, init_sync=False)
    ddp_opt = torch.optim.SGD(ddp_model.parameters(), lr=1e-3, momentum=0.9)
    hvd_model = copy.deepcopy(base)
    hvd_opt = hvd.DistributedOptimizer(
        torch.optim.SGD(hvd_model.parameters(), lr=1e-3, momentum=0.9)
    )

    phases = {"forward": 0.0, "backward": 0.0, "step": 0.0, "launch": 0.0, "reduce": 0.0}
    instrument(GradientReducer, "_launch", "launch", phases)
    instrument(GradientReducer, "reduce", "reduce", phases)

    def timed_step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        phases["forward"] += t1 - t0
        phases["backward"] += t2 - t1
        phases["step"] += t3 - t2

    def ddp_step() -> None:
        timed_step(ddp, ddp_opt)

    def hvd_step() -> None:
        timed_step(hvd_model, hvd_opt)

    def hvd_checked_step() -> None:
        hvd_step()
        current().check_host_updates()

    steps: dict[str, Callable[[], None]] = {
        "ddp": ddp_step,
        "optimizer": hvd_step,
        "optimizer_check": hvd_checked_step,
    }
    for step in steps.values():
        for _ in range(3):  # warm up (DDP rebuilds its buckets at the second iteration)
            step()
    log = None
    if hvd.rank() == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        log = (args.out / "blocks.jsonl").open("w", buffering=1)
    for repeat in range(args.repeats):
        order = VARIANTS[repeat % 3 :] + VARIANTS[: repeat % 3]  # rotate against drift
        for variant in order:
            hvd.allreduce(torch.zeros(1))  # start the block together
            phases.update(dict.fromkeys(phases, 0.0))
            started = time.perf_counter()
            for _ in range(args.steps):
                steps[variant]()
            seconds = (time.perf_counter() - started) / args.steps
            if log is not None:
                split = {k: v / args.steps for k, v in phases.items()}
                record = {"repeat": repeat, "variant": variant, "step_s": seconds, **split}
                log.write(json.dumps(record))
                log.write("\n")
    hvd.shutdown()


if __name__ == "__main__":
    main()
