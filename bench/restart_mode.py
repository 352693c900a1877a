"""Restart mode against torchrun on one machine (prints its figures; asserts nothing).

The same unchanged torchrun DDP script (``tests/integration/workers/restart_worker.py``:
``init_process_group("gloo")`` from the environment, resuming from its own checkpoint), two
processes, Gloo over loopback; one of them SIGKILLs itself once both train. The figure is the
time from the kill to every worker at its first step again, the checkpoint load included:

- ``elasticjob``: ``elasticjob-run --mode restart -np 2 -H 127.0.1.1:2``;
- ``torchrun``: ``torchrun --nproc-per-node 2 --nnodes 1:2 --rdzv-backend c10d
  --max-restarts 3`` (the elastic form the issue names), its rendezvous on a free local port.

Both run in this process tree, one after the other, ``--repeat`` times each; the ratio is
of the medians. Also printed: the time to the first step from the start, and how many
restarts torchrun used for the one kill.

Usage: python bench/restart_mode.py [--repeat 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SCRIPT = (
    Path(__file__).resolve().parents[1] / "tests" / "integration" / "workers" / "restart_worker.py"
)
SCRIPT_ARGS = ["--epochs", "2", "--steps", "30", "--step-s", "0.05", "--fail-at", "1:0:1:sigkill"]
RUN_TIMEOUT_S = 600.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def command(front_end: str, work: Path) -> list[str]:
    script = [str(SCRIPT), "--log-dir", str(work / "events"),
              "--checkpoint", str(work / "ckpt.pt"), *SCRIPT_ARGS]  # fmt: skip
    if front_end == "elasticjob":
        launcher = ["-m", "elasticjob.launcher.cli", "--mode", "restart", "-np", "2"]
        return [sys.executable, *launcher, "-H", "127.0.1.1:2", sys.executable, *script]
    rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    torchrun = ["-m", "torch.distributed.run", "--nproc-per-node", "2", "--nnodes", "1:2"]
    return [sys.executable, *torchrun, *rendezvous, "--max-restarts", "3", *script]


def events(work: Path) -> list[dict[str, Any]]:
    found = [
        json.loads(line)
        for path in sorted((work / "events").glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    return sorted(found, key=lambda e: e["time"])


def one_run(front_end: str, work: Path) -> dict[str, float]:
    work.mkdir(parents=True)
    started = time.time()
    with (work / "output.txt").open("w") as output:
        job = subprocess.run(
            command(front_end, work), stdout=output, stderr=subprocess.STDOUT,
            timeout=RUN_TIMEOUT_S, check=False,
        )  # fmt: skip
    seen = events(work)
    kill = next(e for e in seen if e["ev"] == "kill")
    after = [e for e in seen if e["ev"] == "step" and e["time"] > kill["time"]]
    first_after = {rank: min(e["time"] for e in after if e["rank"] == rank) for rank in (0, 1)}
    first_ever = min(e["time"] for e in seen if e["ev"] == "step")
    starts = [e for e in seen if e["ev"] == "start"]
    return {
        "exit": float(job.returncode),
        "recovery_s": max(first_after.values()) - kill["time"],
        "first_step_s": first_ever - started,
        "restarts": float(max(int(e["env"]["TORCHELASTIC_RESTART_COUNT"]) for e in starts)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each front end")
    parser.add_argument("--keep", type=Path, help="keep the runs' files in this directory")
    args = parser.parse_args()
    medians: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as scratch:
        root = args.keep or Path(scratch)
        for front_end in ("elasticjob", "torchrun"):
            runs = [one_run(front_end, root / f"{front_end}-{k}") for k in range(args.repeat)]
            for k, figures in enumerate(runs):
                print(
                    f"{front_end} run {k}: " + ", ".join(f"{n}={v:.2f}" for n, v in figures.items())
                )
            medians[front_end] = statistics.median(r["recovery_s"] for r in runs)
            print(f"{front_end}: median recovery {medians[front_end]:.2f} s", flush=True)
    ratio = medians["elasticjob"] / medians["torchrun"]
    print(f"restart mode / torchrun recovery: {ratio:.3f} (goal <= 0.5)")


if __name__ == "__main__":
    main()
