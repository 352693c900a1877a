"""What durable checkpoints cost a training loop: a ~100 MB model + optimizer state committed
after every step, with a checkpoint every 10 commits (``ELASTICJOB_CHECKPOINT_EVERY_COMMITS``,
rank 0's writer thread) against the same loop without checkpoints, in interleaved blocks
(the machine's load drifts), one torch thread (the standalone runtime).

Cost = mean step time with checkpoints / mean without - 1 (the mean, not the median: a
checkpoint's cost falls on a few steps), and the extra time the training thread spends in
``commit()`` (pinning the snapshot, starting the writer). It also prints the checkpoints
written against the ones due (a writer still busy skips a due commit rather than block the
step) and the write bandwidth (bytes over the writer's time: pickling, CRC32, write, fsync).

Run: ``nice -n 5 .venv/bin/python bench/checkpoint.py [--folder DIR]`` (default: a fresh
folder under the system's temporary folder; it is removed afterwards).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from pathlib import Path

import torch
from commit import (  # beside this script (run by path)
    model_and_optimizer,
    state_bytes,
    stepper,
    timed_step,
)

import elasticjob.worker_runtime as hvd
from elasticjob.wire.messages import CheckpointReport
from elasticjob.worker_contract import (
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_EVERY_COMMITS,
    ENV_CHECKPOINT_KEEP,
)
from elasticjob.worker_runtime import basics
from elasticjob.worker_runtime.elastic import TorchState

EVERY = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--folder", type=Path)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--steps", type=int, default=2 * EVERY)
    args = parser.parse_args()
    for name in [n for n in os.environ if n.startswith("ELASTICJOB_")]:
        del os.environ[name]
    torch.set_num_threads(1)
    hvd.init()
    reports: list[CheckpointReport] = []
    basics.current().reports.checkpoint = reports.append  # type: ignore[method-assign]
    folder = args.folder or Path(tempfile.mkdtemp(prefix="checkpoint-bench-"))
    print(f"load average at start: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores")
    print(f"checkpoints in {folder}")
    try:
        run(folder, args.batch, args.blocks, args.steps, reports)
    finally:
        if args.folder is None:
            shutil.rmtree(folder, ignore_errors=True)
    print(f"load average at end: {os.getloadavg()[0]:.2f} (1 min)")
    hvd.shutdown()


def run(folder: Path, batch: int, blocks: int, steps: int, reports: list[CheckpointReport]) -> None:
    model, optimizer = model_and_optimizer()
    step = stepper(model, optimizer, batch)
    step()
    without = TorchState(model, optimizer, epoch=0)
    os.environ[ENV_CHECKPOINT_DIR] = str(folder)
    os.environ[ENV_CHECKPOINT_EVERY_COMMITS] = str(EVERY)
    os.environ[ENV_CHECKPOINT_KEEP] = "2"
    with_checkpoints = TorchState(model, optimizer, epoch=0)
    size_mb = state_bytes(model, optimizer) / 1e6
    times: dict[str, list[float]] = {"commit every step": [], "+ checkpoint every 10": []}
    in_commit: dict[str, list[float]] = {mode: [] for mode in times}
    states = dict(zip(times, (without, with_checkpoints), strict=True))
    for block in range(blocks + 1):  # the first block warms up
        with_checkpoints.checkpointing.wait()
        if block == 1:
            reports.clear()  # the warm-up block's
        order = list(states.items())
        for mode, state in order if block % 2 else order[::-1]:  # ABBA: no order effect
            with_checkpoints.checkpointing.wait()  # no write of the other mode's block
            for _ in range(steps):
                total, committing = timed_step(step, state.commit)
                if block:
                    times[mode].append(total)
                    in_commit[mode].append(committing)
    with_checkpoints.checkpointing.wait()
    base = statistics.mean(times["commit every step"])
    print(
        f"state {size_mb:.1f} MB, batch {batch}, {blocks} interleaved blocks of {steps} steps "
        f"per mode (mean step time):"
    )
    for mode, samples in times.items():
        mean = statistics.mean(samples)
        blocked = statistics.mean(in_commit[mode])
        print(
            f"  {mode:24s} {mean * 1e3:7.1f} ms  cost {mean / base - 1:+6.2%}"
            f"  (in commit() {blocked * 1e3:6.2f} ms per step)"
        )
    extra = statistics.mean(in_commit["+ checkpoint every 10"]) - statistics.mean(
        in_commit["commit every step"]
    )
    print(
        f"  the training thread's own cost of checkpoints: {extra * 1e3:+.2f} ms per step "
        f"= {extra / base:+.2%} of the step"
    )
    due = blocks * steps // EVERY
    written = sum(r.size_bytes for r in reports) / 1e6
    seconds = sum(r.seconds for r in reports)
    print(
        f"  checkpoints written: {len(reports)} of {due} due; "
        f"{written / max(seconds, 1e-9):.0f} MB/s write bandwidth "
        f"({statistics.mean(r.seconds for r in reports):.2f} s per checkpoint of "
        f"{reports[0].size_bytes / 1e6:.1f} MB)"
        if reports
        else "  no checkpoint written"
    )


if __name__ == "__main__":
    main()
