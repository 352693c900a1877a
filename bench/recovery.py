"""Recovery and overhead benchmark of the elastic core (prints its figures; asserts nothing).

On one machine, Gloo over loopback, a ~5M-parameter MLP, commit every 5 steps:

1. kill:   4 workers on 2 hosts, rank 3 SIGKILLs itself at step 20; figure: seconds from the
           kill to the first step the survivors complete in the new round;
2. join:   2 workers on 1 host, a second host with 2 slots is added at step 10; figures: the
           survivors' pause across the round change (last step of the old round to first step
           of the new one) and the longest gap between their steps overall;
3. steady: 4 workers on 2 hosts alternate blocks of the same training loop with and without
           ``check_host_updates()`` every step; figure: the ratio of mean step times.

Usage: python bench/recovery.py [--only kill|join|steady]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WORKER = HERE / "bench_worker.py"
LAUNCHER = (
    "import logging, sys; "
    "logging.basicConfig(level=logging.INFO, "
    "format='elasticjob-run %(created).6f %(levelname)s %(name)s: %(message)s'); "
    "logging.getLogger('elasticjob.launcher.processes').setLevel(logging.DEBUG); "
    "from elasticjob.launcher.run_command import main; sys.exit(main(sys.argv[1:]))"
)
"""``elasticjob-run`` with a timestamp on each of its log lines (and the exits it sees)."""


def launch(launcher: list[str], worker: list[str], log_dir: Path) -> subprocess.Popen[str]:
    command = [sys.executable, "-c", LAUNCHER, *launcher,
               sys.executable, str(WORKER), "--log-dir", str(log_dir), *worker]  # fmt: skip
    output = (log_dir.parent / f"{log_dir.name}.out").open("w")
    return subprocess.Popen(command, stdout=output, stderr=subprocess.PIPE, text=True)


def finish(job: subprocess.Popen[str], timeout_s: float = 300) -> list[tuple[float, str]]:
    """Wait for the job; return the launcher's log lines as (time, text)."""
    try:
        _, stderr = job.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        job.kill()  # its workers die with it
        raise
    if job.returncode != 0:
        raise SystemExit(f"benchmark job failed ({job.returncode}):\n{stderr[-3000:]}")
    lines = []
    for line in stderr.splitlines():
        fields = line.split(" ", 2)
        if len(fields) == 3 and fields[0] == "elasticjob-run":
            with contextlib.suppress(ValueError):
                lines.append((float(fields[1]), fields[2]))
    return lines


def events(log_dir: Path) -> list[dict[str, Any]]:
    found = [
        json.loads(line) for p in log_dir.glob("*.jsonl") for line in p.read_text().splitlines()
    ]
    return sorted(found, key=lambda e: e["t"])


def step_times(evs: list[dict[str, Any]], rank: int, round_number: int) -> list[float]:
    return [
        e["t"]
        for e in evs
        if e["ev"] == "step" and e["rank"] == rank and e["round"] == round_number
    ]


def median_interval(times: list[float]) -> float:
    return statistics.median(b - a for a, b in itertools.pairwise(times))


def first_time(lines: list[tuple[float, str]], *needles: str) -> float:
    """When the first line that contains every one of ``needles`` was logged."""
    found = [t for t, text in lines if all(n in text for n in needles)]
    if not found:
        raise SystemExit(f"no log line with {needles}")
    return min(found)


def worker_logs(evs: list[dict[str, Any]], pid: int) -> list[tuple[float, str]]:
    return [(e["t"], e["msg"]) for e in evs if e["ev"] == "log" and e["pid"] == pid]


def kill_breakdown(
    evs: list[dict[str, Any]], launcher: list[tuple[float, str]]
) -> dict[str, float]:
    """The path from the kill to the survivors' first step, each moment relative to the kill:
    the launcher sees the exit, the driver posts the failure notice, the survivors have
    aborted their group (the last to roll back), the killed host's other workers are gone,
    the driver publishes round 2, the survivors joined it, synced their state, stepped."""
    kill, killed = next((e["t"], e["worker"]) for e in evs if e["ev"] == "kill")
    survivors = {e["pid"] for e in evs if e["ev"] == "step" and e["round"] == 2}
    per = {pid: worker_logs(evs, pid) for pid in survivors}
    firsts = [min(e["t"] for e in evs if e["ev"] == "step" and e["round"] == 2 and e["pid"] == pid)
              for pid in survivors]  # fmt: skip
    moments = {
        "exit_seen": first_time(launcher, f"worker {killed} exited"),
        "notice_posted": first_time(launcher, f"worker {killed} of round 1 failed"),
        "groups_aborted": max(first_time(logs, "rolling back") for logs in per.values()),
        "round_formed": first_time(launcher, "round 2:"),
        "joined": max(first_time(logs, "joined round 2") for logs in per.values()),
        "synced": max(first_time(logs, "state ", "round=2") for logs in per.values()),
        "first_step": min(firsts),
        "all_stepped": max(firsts),
    }
    host = killed.split("[", maxsplit=1)[0]
    mates = [t for t, text in launcher if f"worker {host}[" in text and "left the job" in text]
    if mates:
        moments["host_mate_gone"] = max(mates)
    return {name: t - kill for name, t in sorted(moments.items(), key=lambda kv: kv[1])}


def bench_kill(tmp: Path) -> dict[str, float]:
    """4 workers on 2 hosts; rank 3 (127.0.1.2[1]) dies, its host is blacklisted, its
    host-mate leaves: 4 -> 2."""
    log_dir = tmp / "kill"
    job = launch(["-np", "4", "--min-np", "2", "-H", "127.0.1.1:2,127.0.1.2:2"],
                 ["--steps", "40", "--kill-at", "20"], log_dir)  # fmt: skip
    launcher = finish(job)
    evs = events(log_dir)
    return {
        **{f"{k}_s": v for k, v in kill_breakdown(evs, launcher).items()},
        "step_s_4_workers": median_interval(step_times(evs, 0, 1)),
        "step_s_2_workers": median_interval(step_times(evs, 0, 2)),
    }


def bench_join(tmp: Path) -> dict[str, float]:
    log_dir, hosts, progress = tmp / "join", tmp / "hosts.txt", tmp / "progress"
    hosts.write_text("127.0.1.1:2\n")
    script = tmp / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    job = launch(["-np", "2", "--min-np", "2", "--host-discovery-script", str(script)],
                 ["--steps", "120", "--join-file", str(progress)], log_dir)  # fmt: skip
    deadline = time.monotonic() + 120
    while not (progress.exists() and progress.read_text() and int(progress.read_text()) >= 10):
        if time.monotonic() > deadline or job.poll() is not None:
            raise SystemExit("the join benchmark never reached step 10")
        time.sleep(0.05)
    added_at = time.time()
    hosts.write_text("127.0.1.1:2\n127.0.1.2:2\n")
    finish(job)
    evs = events(log_dir)
    old, new = step_times(evs, 0, 1), step_times(evs, 0, 2)
    if not new:
        raise SystemExit("the newcomers never joined")
    everything = old + new
    return {
        "host_added_to_new_round_s": new[0] - added_at,
        "pause_across_round_change_s": new[0] - old[-1],
        "longest_gap_between_steps_s": max(b - a for a, b in itertools.pairwise(everything)),
        "step_s_before_join": median_interval([t for t in old if t < added_at]),
    }


def bench_steady(tmp: Path) -> dict[str, float]:
    log_dir = tmp / "steady"
    job = launch(["-np", "4", "-H", "127.0.1.1:2,127.0.1.2:2"], ["--steady", "20"], log_dir)
    finish(job)
    blocks = [e for e in events(log_dir) if e["ev"] == "block"]
    elastic = statistics.mean(b["step_s"] for b in blocks if b["elastic"])
    plain = statistics.mean(b["step_s"] for b in blocks if not b["elastic"])
    return {"step_s_with_check": elastic, "step_s_without": plain, "ratio": elastic / plain}


def one_slot_hosts(count: int) -> list[str]:
    return [f"127.0.1.{i + 1}:1" for i in range(count)]


def size_kill(tmp: Path, size: int) -> dict[str, float]:
    """``size`` workers, one per host, the small model; the last rank dies at step 10."""
    log_dir = tmp / "kill"
    hosts = ",".join(one_slot_hosts(size))
    job = launch(["-np", str(size), "--min-np", str(size - 1), "-H", hosts],
                 ["--small", "--steps", "100000", "--steps-after-change", "10", "--kill-at", "10",
                  "--kill-rank", str(size - 1)], log_dir)  # fmt: skip
    launcher = finish(job)
    moments = kill_breakdown(events(log_dir), launcher)
    return {
        "kill_to_step": moments["first_step"],
        "exit_seen": moments["exit_seen"],
        "re_form": moments["joined"] - moments["round_formed"],
        "sync": moments["synced"] - moments["joined"],
    }


def size_join(tmp: Path, size: int) -> dict[str, float]:
    """``size - 1`` workers, one per host, the small model; a host with one slot is added at
    step 10: the members' pause, and the new round's group formation and (full) sync."""
    log_dir, hosts, progress = tmp / "join", tmp / "hosts", tmp / "step"
    hosts.write_text("\n".join(one_slot_hosts(size - 1)) + "\n")
    progress.unlink(missing_ok=True)  # a previous run's
    script = tmp / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    job = launch(["-np", str(size - 1), "--min-np", str(size - 1), "--host-discovery-script",
                  str(script)],
                 ["--small", "--steps", "100000", "--steps-after-change", "10", "--join-file",
                  str(progress)], log_dir)  # fmt: skip
    deadline = time.monotonic() + 300
    while not (progress.exists() and progress.read_text() and int(progress.read_text()) >= 10):
        if time.monotonic() > deadline or job.poll() is not None:
            raise SystemExit(f"the scale-out run at {size} never reached step 10")
        time.sleep(0.05)
    hosts.write_text("\n".join(one_slot_hosts(size)) + "\n")
    launcher = finish(job)
    evs = events(log_dir)
    old, new = step_times(evs, 0, 1), step_times(evs, 0, 2)
    members = {e["pid"] for e in evs if e["ev"] == "step" and e["round"] == 2}
    logs = {pid: worker_logs(evs, pid) for pid in members}
    joined = max(first_time(lines, "joined round 2") for lines in logs.values())
    synced = max(first_time(lines, "state ", "round=2") for lines in logs.values())
    return {
        "pause": new[0] - old[-1],
        "re_form": joined - first_time(launcher, "round 2:"),
        "sync": synced - joined,
    }


def bench_sizes(tmp: Path, sizes: list[int], repeat: int) -> None:
    """Print, per world size, the median and range over ``repeat`` runs of each figure."""
    print(f"load average before: {os.getloadavg()[0]:.2f}", flush=True)
    print(f"{'N':>3} {'figure':<26} {'median':>8} {'min':>8} {'max':>8}", flush=True)
    for size in sizes:
        runs: dict[str, list[float]] = {}
        for run in range(repeat):
            for prefix, bench in (("kill", size_kill), ("scale-out", size_join)):
                folder = tmp / f"{prefix}-{size}-{run}"  # each run's own logs
                folder.mkdir(parents=True)
                for name, value in bench(folder, size).items():
                    runs.setdefault(f"{prefix} {name}", []).append(value)
        for name, values in runs.items():
            print(f"{size:>3} {name:<26} {statistics.median(values):8.3f} "
                  f"{min(values):8.3f} {max(values):8.3f}", flush=True)  # fmt: skip
        print(f"    load average: {os.getloadavg()[0]:.2f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=("kill", "join", "steady"))
    parser.add_argument("--keep", type=Path, help="keep the jobs' output in this directory")
    parser.add_argument("--sizes", help="world sizes of the recovery curve, e.g. 2,4,8,16")
    parser.add_argument("--repeat", type=int, default=3, help="runs per world size")
    args = parser.parse_args()
    if args.sizes:
        with tempfile.TemporaryDirectory() as scratch:
            tmp = args.keep or Path(scratch)
            tmp.mkdir(parents=True, exist_ok=True)
            bench_sizes(tmp, [int(n) for n in args.sizes.split(",")], args.repeat)
        return
    benches = {"kill": bench_kill, "join": bench_join, "steady": bench_steady}
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.keep or Path(scratch)
        tmp.mkdir(parents=True, exist_ok=True)
        for name, bench in benches.items():
            if args.only and name != args.only:
                continue
            figures = bench(tmp)
            print(f"{name}: " + ", ".join(f"{k}={v:.3f}" for k, v in figures.items()), flush=True)


if __name__ == "__main__":
    main()
