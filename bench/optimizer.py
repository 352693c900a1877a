"""DistributedOptimizer benchmark (prints its figures; asserts nothing).

Four worker processes over Gloo on the loopback (one host, one torch thread each) train a
~25M-parameter MLP in short alternating blocks (a few steps each, the ranks aligned before
each block, the order rotated every repeat, so that every variant sees the same machine
load) with:

- ``ddp``: torch's ``DistributedDataParallel`` on the round's group (the baseline);
- ``optimizer``: ``hvd.DistributedOptimizer`` (reductions launched from backward hooks);
- ``optimizer_check``: the same with ``check_host_updates()`` after every step.

Figures: the median over repeats of each variant's mean steady-state step time, and the
ratios optimizer / ddp (goal: within 5 %) and optimizer_check / optimizer (goal: within 1 %),
each as the median of the per-repeat ratios with their quartiles and range.

Usage: nice -n 5 python bench/optimizer.py [--repeats 40] [--steps 2] [--batch-size 64]
[--workers 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKER = HERE / "optimizer_worker.py"


def run_job(
    out: Path, workers: int, worker_args: list[str], script: Path = WORKER
) -> list[dict[str, float | int | str]]:
    """Run ``script`` as a CPU job of ``workers`` processes on one loopback host; the lines
    of the ``blocks.jsonl`` its rank 0 writes under ``out``."""
    launcher = ["-np", str(workers), "-H", f"127.0.1.1:{workers}", "--gloo"]
    worker = [sys.executable, str(script), "--out", str(out), *worker_args]
    command = [sys.executable, "-m", "elasticjob.launcher.run_command", *launcher, *worker]
    # A CPU benchmark: keep the workers off any GPU of the machine.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    job = subprocess.run(
        command, check=False, capture_output=True, text=True, timeout=1800, env=env
    )
    if job.returncode != 0:
        output = f"{job.stderr[-3000:]}\n{job.stdout[-3000:]}"
        raise SystemExit(f"benchmark job failed ({job.returncode}):\n{output}")
    lines = (out / "blocks.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def ratio_line(name: str, ratios: list[float]) -> str:
    median = statistics.median(ratios)
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return (
        f"{name}: {median:.4f} ({(median - 1) * 100:+.2f} %), quartiles {q1:.4f}..{q3:.4f}, "
        f"range {min(ratios):.4f}..{max(ratios):.4f} over {len(ratios)} repeats"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per block")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as scratch:
        blocks = run_job(
            Path(scratch),
            args.workers,
            ["--repeats", str(args.repeats), "--steps", str(args.steps),
             "--batch-size", str(args.batch_size)],
        )  # fmt: skip
    by_repeat: dict[int, dict[str, float]] = {}
    for block in blocks:
        by_repeat.setdefault(int(block["repeat"]), {})[str(block["variant"])] = float(
            block["step_s"]
        )
    repeats = list(by_repeat.values())
    print(f"load average after: {os.getloadavg()[0]:.2f} (1 min)")
    for variant in ("ddp", "optimizer", "optimizer_check"):
        times = [r[variant] for r in repeats]
        mine = [b for b in blocks if b["variant"] == variant]
        split = ", ".join(
            f"{phase} {statistics.median(float(b[phase]) for b in mine) * 1000:.1f}"
            for phase in ("forward", "backward", "step", "launch", "reduce")
        )
        print(
            f"{variant}: median step {statistics.median(times) * 1000:.1f} ms "
            f"(min {min(times) * 1000:.1f}, max {max(times) * 1000:.1f}; median {split} ms)"
        )
    print(ratio_line("optimizer / ddp", [r["optimizer"] / r["ddp"] for r in repeats]))
    print(
        ratio_line(
            "optimizer_check / optimizer", [r["optimizer_check"] / r["optimizer"] for r in repeats]
        )
    )


if __name__ == "__main__":
    main()
