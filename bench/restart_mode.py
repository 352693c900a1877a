"""Restart mode against torchrun on one machine (prints its figures; asserts nothing).

The same unchanged torchrun DDP script (``tests/integration/workers/restart_worker.py``:
``init_process_group("gloo")`` from the environment, resuming from its own checkpoint), two
processes, Gloo over loopback; one of them SIGKILLs itself once both have trained two epochs
(6 s: a failure rarely comes in a job's first seconds). The figure is the time from the
kill to every worker at its first step again, the checkpoint load included:

- ``elasticjob``: ``elasticjob-run --mode restart -np 2 -H 127.0.1.1:2``;
- ``torchrun``: ``torchrun --nproc-per-node 2 --nnodes 1:2 --rdzv-backend c10d
  --max-restarts 3`` (the elastic form the issue names), its rendezvous on a free local port;
- ``torchrun-own-store``: the same with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, torchrun's
  way around its shared store, whose keys a restarted worker can read from the attempt before
  (pytorch/pytorch#135712): rank 0's worker then serves the store itself.

All run in this process tree, one after the other; a run that has not recovered within
``--give-up`` seconds of the kill is stopped and reported as such. The ratio is of the
medians, against the faster torchrun that recovered. Also printed: the time to the first step
from the start, and the restarts used for the one kill.

Usage: python bench/restart_mode.py [--repeat 3] [--give-up 180] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
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
SCRIPT_ARGS = ["--epochs", "3", "--steps", "30", "--step-s", "0.1", "--fail-at", "2:0:1:sigkill"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def command(front_end: str, work: Path) -> list[str]:
    script = [str(SCRIPT), "--log-dir", str(work / "events"),
              "--checkpoint", str(work / "ckpt.pt"), *SCRIPT_ARGS]  # fmt: skip
    if front_end == "elasticjob":
        launcher = ["-m", "elasticjob.launcher.run_command", "--mode", "restart", "-np", "2"]
        return [sys.executable, *launcher, "-H", "127.0.1.1:2", sys.executable, *script]
    rendezvous = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    torchrun = ["-m", "torch.distributed.run", "--nproc-per-node", "2", "--nnodes", "1:2"]
    return [sys.executable, *torchrun, *rendezvous, "--max-restarts", "3", *script]


STOP_GRACE_S = 30.0
"""How long a front end may take to stop its workers after SIGTERM."""
FRONT_ENDS = {
    "elasticjob": {},
    "torchrun": {},
    "torchrun-own-store": {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"},
}
"""Each front end and the variables it runs with."""


def events(work: Path) -> list[dict[str, Any]]:
    found = [
        json.loads(line)
        for path in sorted((work / "events").glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    return sorted(found, key=lambda e: e["time"])


def run_until_recovered(front_end: str, work: Path, give_up_s: float) -> int | None:
    """Run the job; stop it once ``give_up_s`` passed since the kill without every worker at
    a step again. Returns its exit status (None: stopped)."""
    env = {**os.environ, **FRONT_ENDS[front_end]}
    with (work / "output.txt").open("w") as output:
        job = subprocess.Popen(
            command(front_end, work), stdout=output, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip
        while job.poll() is None:
            time.sleep(1.0)  # a benchmark's poll of the files the script writes
            seen = events(work) if (work / "events").exists() else []
            kills = [e["time"] for e in seen if e["ev"] == "kill"]
            if kills and time.time() - kills[0] > give_up_s and recovery(seen) is None:
                stop(job)
                return None
    return job.returncode


def stop(job: subprocess.Popen[bytes]) -> None:
    """Stop a front end that gave up: SIGTERM first, so that it stops its workers (torchrun
    starts each in a session of its own, which a signal to the front end's group misses),
    then SIGKILL to whatever is left of its group."""
    os.killpg(job.pid, signal.SIGTERM)
    try:
        job.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()


def recovery(seen: list[dict[str, Any]]) -> float | None:
    """Seconds from the kill to every rank's first step after it (None: not yet)."""
    kill = next(e["time"] for e in seen if e["ev"] == "kill")
    after = [e for e in seen if e["ev"] == "step" and e["time"] > kill]
    firsts = [min((e["time"] for e in after if e["rank"] == r), default=None) for r in (0, 1)]
    return None if None in firsts else max(t for t in firsts if t is not None) - kill


def one_run(front_end: str, work: Path, give_up_s: float) -> dict[str, float | None]:
    work.mkdir(parents=True)
    started = time.time()
    exit_status = run_until_recovered(front_end, work, give_up_s)
    seen = events(work)
    starts = [e for e in seen if e["ev"] == "start"]
    return {
        "exit": exit_status,
        "recovery_s": recovery(seen),
        "first_step_s": min(e["time"] for e in seen if e["ev"] == "step") - started,
        "restarts": max(int(e["env"]["TORCHELASTIC_RESTART_COUNT"]) for e in starts),
    }


def shown(value: float | None) -> str:
    return "none" if value is None else f"{value:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs of each front end")
    parser.add_argument("--give-up", type=float, default=180.0, help="seconds after the kill")
    parser.add_argument("--keep", type=Path, help="keep the runs' files in this directory")
    args = parser.parse_args()
    medians: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as scratch:
        root = args.keep or Path(scratch)
        for front_end in FRONT_ENDS:
            runs = [
                one_run(front_end, root / f"{front_end}-{k}", args.give_up)
                for k in range(args.repeat)
            ]
            for k, figures in enumerate(runs):
                print(
                    f"{front_end} run {k}: "
                    + ", ".join(f"{n}={shown(v)}" for n, v in figures.items())
                )
            recovered = [r["recovery_s"] for r in runs if r["recovery_s"] is not None]
            if len(recovered) < len(runs):
                print(f"{front_end}: {len(runs) - len(recovered)} of {len(runs)} runs did not "
                      f"recover within {args.give_up:.0f} s of the kill")  # fmt: skip
            if recovered:
                medians[front_end] = statistics.median(recovered)
                print(f"{front_end}: median recovery {medians[front_end]:.2f} s", flush=True)
    torchruns = [medians[f] for f in FRONT_ENDS if f != "elasticjob" and f in medians]
    if "elasticjob" in medians and torchruns:
        ratio = medians["elasticjob"] / min(torchruns)
        print(f"restart mode / the faster torchrun: {ratio:.3f} (goal <= 0.5)")


if __name__ == "__main__":
    main()
