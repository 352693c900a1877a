"""Recovery benchmark of a model sharded with FSDP2 under ``hvd.elastic.ShardedState``, against
the standard restart-and-reload path (prints its figures; asserts nothing).

A wide MLP (``--layers`` linear layers of ``--dim`` x ``--dim``; ``--params`` picks the width)
with AdamW, 4 ranks, Gloo on the CPU, one thread each (``sharded_recovery_worker.py``):

1. elastic, under ``elasticjob-run`` on 2 loopback hosts x 2 slots, ``ShardedState`` with
   ``redundancy=1`` (copies on the other host):
   - commit cost: alternating blocks of steps with ``state.commit()`` every 10 steps and
     without commits (as ``recovery.py``'s steady mode), and each commit's time;
   - kill: rank 3 SIGKILLs itself 3 steps past a commit. The driver's plan for a lost slot
     (``elasticjob.driver.slot_loss``) now restarts it in place, which moves a quarter of a
     replica: a fresh process takes the slot and receives its shard from the copy. Before
     that plan its host was blacklisted, its host-mate left, and the 2 survivors rebuilt the
     lost shards from their copies and resharded onto 2 ranks (the figures in the docs).
     ``--one-slot-hosts`` runs it on 4 hosts of one slot: the killed rank's host goes, and
     the 3 survivors rebuild its shard from their copies and reshard onto 3 ranks.
     From the kill to the survivors' first completed step, broken down: detect (the
     survivors abort), re-form (the new round's group), rebuild (``build``), reshard
     (exchange, transfers and load), re-commit (the new layout's snapshot; its copies move
     during the first step), first step;
   - memory: each rank's resident high-water mark (VmHWM) right before the kill (steady state
     after commits: it includes the snapshot and the copies it keeps) and after the
     survivors' first step in the new round;
   - the reshard's bandwidth: the bytes it sent over its time, against the survivors sending
     one another as many bytes over plain Gloo right after it (same processes, same run);
2. HSDP, under ``elasticjob-run`` on 4 loopback hosts x 2 slots (8 ranks, each host's two
   ranks shard the model, the hosts replicate it; no A/B blocks): rank 7 SIGKILLs itself 3
   steps past a commit, its host goes, the 3 other replicas hold every shard: nothing moves;
3. restart, under ``torchrun --max-restarts 1`` on one host x 4 slots, plain
   ``torch.distributed``: the job saves a ``torch.distributed.checkpoint`` (DCP) on local disk,
   rank 3 SIGKILLs itself, torchrun stops and restarts every process, which load the checkpoint
   into a freshly sharded model and step. From the kill to that step, broken down: processes
   restarted, ``import torch``, group init, model build, DCP load, first step.

The goals are measured to *training resumed*: the moment the survivors' first step begins
(every survivor's sync done; for the restart, every process's DCP load done). A survivor that
keeps its shard copies its commit's optimizer state beside its first forward and backward
pass; how long its optimizer step then waited for those copies is printed with the first step.

Every process of every path runs with ``THP_MEM_ALLOC_ENABLE=1``, which ``elasticjob-run``
and the operator give every worker by default (``elasticjob/library_env.py``); the benchmark
gives it to the restart's processes too: torch's CPU allocator then puts each tensor of 2 MB
or more on transparent huge pages, so that the kernel faults in, zeroes and frees a tensor's
memory 2 MB at a time instead of 4 KB (a killed process of a few GB is gone in a tenth of the time).
``--no-huge-pages`` sets it to 0 for every path (as does ``THP_MEM_ALLOC_ENABLE=0`` in the
benchmark's environment).

Usage: python bench/sharded_recovery.py [--params 100e6 | --dim 512 --layers 4]
       [--paths elastic,hsdp,restart] [--keep DIR] [--no-huge-pages] [--one-slot-hosts]
       python bench/sharded_recovery.py --sizes 10e6,30e6,100e6 [--plot FILE.svg]
       (each path's time to training resumed against model size, as a table and a picture)
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from line_chart import line_chart
from recovery import LAUNCHER, events, finish, first_time, worker_logs

from elasticjob.library_env import ENV_TORCH_HUGE_PAGES as HUGE_PAGES
from elasticjob.library_env import with_worker_defaults
from elasticjob.worker_contract import ENV_COLLECTIVE_TIMEOUT

HERE = Path(__file__).resolve().parent
WORKER = HERE / "sharded_recovery_worker.py"
HOSTS = "127.0.1.1:2,127.0.1.2:2"
HSDP_HOSTS = "127.0.1.1:2,127.0.1.2:2,127.0.1.3:2,127.0.1.4:2"
ONE_SLOT_HOSTS = "127.0.1.1:1,127.0.1.2:1,127.0.1.3:1,127.0.1.4:1"
"""``--one-slot-hosts``: the killed rank's host has no other process, so it goes (a reshard)."""
GIB = 1024**3

Events = list[dict[str, Any]]
Runs = dict[str, Events]


def run_elastic(
    log_dir: Path,
    model: list[str],
    timeout_s: float,
    collective_timeout_s: float | None,
    hosts: str = HOSTS,
) -> tuple[Events, Any]:
    ranks = sum(int(host.split(":")[1]) for host in hosts.split(","))
    command = [sys.executable, "-c", LAUNCHER, "-np", str(ranks), "--min-np", "2", "-H", hosts,
               sys.executable, str(WORKER), "--log-dir", str(log_dir), *model]  # fmt: skip
    output = (log_dir.parent / f"{log_dir.name}.out").open("w")
    env = dict(os.environ)
    if collective_timeout_s is not None:
        env[ENV_COLLECTIVE_TIMEOUT] = str(collective_timeout_s)
    job = subprocess.Popen(command, stdout=output, stderr=subprocess.PIPE, text=True, env=env)
    launcher = finish(job, timeout_s)
    (log_dir.parent / f"{log_dir.name}.launcher").write_text(
        "".join(f"{t:.6f} {text}\n" for t, text in launcher)
    )
    return events(log_dir), launcher


def run_restart(log_dir: Path, model: list[str], timeout_s: float) -> Events:
    checkpoint = log_dir.parent / "dcp"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "4", "--max-restarts", "1", "--monitor-interval", "0.1",
               str(WORKER), "--restart", "--log-dir", str(log_dir), "--checkpoint",
               str(checkpoint), "--save-at", "2", "--kill-at", "4", *model]  # fmt: skip
    output = (log_dir.parent / f"{log_dir.name}.out").open("w")
    env = with_worker_defaults(os.environ)  # as elasticjob-run gives its workers
    job = subprocess.run(command, stdout=output, stderr=subprocess.PIPE, text=True,
                         timeout=timeout_s, check=False, env=env)  # fmt: skip
    if job.returncode != 0:
        raise SystemExit(f"the restart job failed ({job.returncode}):\n{job.stderr[-3000:]}")
    return events(log_dir)


def huge_pages() -> str:
    """Whether the workers run with torch's huge pages (``on`` unless the environment says 0)."""
    return "on" if with_worker_defaults(os.environ)[HUGE_PAGES] == "1" else "off"


def learned_of_failure(lines: list[tuple[float, str]]) -> float:
    """When a survivor learned that its round failed: the driver's notice, or one of its own
    collectives failing first (the notice then comes once it has left the round)."""
    found = [t for t, text in lines if "aborting the group" in text or "collective failed" in text]
    if not found:
        raise SystemExit("a survivor never logged that its round failed")
    return min(found)


def elastic_kill(evs: Events) -> dict[str, float]:
    """The kill -> the survivors' first completed step of round 2, in segments (seconds)."""
    kill = next(e["t"] for e in evs if e["ev"] == "kill")
    before = {e["pid"] for e in evs if e["ev"] == "step" and e["round"] == 1}
    survivors = {e["pid"] for e in evs if e["ev"] == "step" and e["round"] == 2} & before
    logs = {pid: worker_logs(evs, pid) for pid in survivors}
    noticed = max(learned_of_failure(lines) for lines in logs.values())
    aborted = max(first_time(lines, "rolling back") for lines in logs.values())
    joined = max(first_time(lines, "joined round 2") for lines in logs.values())
    syncs = [e for e in evs if e["ev"] == "sync" and e["round"] == 2]
    synced = max(e["t"] for e in syncs)
    stepped = max(
        min(e["t"] for e in evs if e["ev"] == "step" and e["round"] == 2 and e["pid"] == pid)
        for pid in survivors
    )
    parts = {
        "notice (every survivor has it, or failed a collective)": noticed - kill,
        "detect (every survivor aborted)": aborted - kill,
        "re-form (to the new group)": joined - aborted,
        "rebuild (build_s)": max(e["build_s"] for e in syncs),
        "reshard (exchange+reshard+load)": max(
            e["exchange_s"] + e["reshard_s"] + e["load_s"] for e in syncs
        ),
        "re-commit's snapshot (commit_s)": max(e["commit_s"] for e in syncs),
    }
    parts["sync, rest"] = synced - joined - sum(list(parts.values())[3:])
    parts["first step"] = stepped - synced
    parts["  of which waited for the optimizer state's copies"] = max(
        e.get("state_copy_wait_s", 0.0) for e in evs if e["ev"] == "step" and e["round"] == 2
    )
    parts["to training resumed"] = synced - kill
    parts["total"] = stepped - kill
    parts["total, less the wait past the notice"] = stepped - kill - (aborted - noticed)
    return parts


def restart_kill(evs: Events) -> dict[str, float]:
    """The kill -> the restarted job's first completed step, in segments (seconds)."""
    kill = next(e["t"] for e in evs if e["ev"] == "kill")
    again = [e for e in evs if e.get("attempt") == 1]

    def last(event: str, field: str = "t") -> float:
        return max(e[field] for e in again if e["ev"] == event)

    moments = {
        "processes restarted": last("started", "started"),
        "import torch": last("started", "imported"),
        "group init": last("group"),
        "model build": last("built"),
        "DCP load": last("loaded"),
        "first step": last("step"),
    }
    parts, before = {}, kill
    for name, moment in moments.items():
        parts[name], before = moment - before, moment
    parts["to training resumed"] = moments["DCP load"] - kill
    parts["total"] = moments["first step"] - kill
    return parts


def reshard_bandwidth(evs: Events) -> str:
    """The reshard's bandwidth against a plain Gloo exchange of the same bytes between the
    same processes (the survivors, right after it)."""
    syncs = [e for e in evs if e["ev"] == "sync" and e["round"] == 2]
    sent, reshard_s = max(e["sent_bytes"] for e in syncs), max(e["reshard_s"] for e in syncs)
    baselines = [e["seconds"] for e in evs if e["ev"] == "baseline"]
    if not sent or not baselines:
        return "   the reshard sent nothing: no bandwidth to compare"
    ours, plain = sent / reshard_s / 1e9, sent / max(baselines) / 1e9
    return (f"   reshard: {sent / 1e9:.3f} GB sent in {reshard_s:.3f} s, {ours:.2f} GB/s; plain "
            f"Gloo send/recv of the same bytes {plain:.2f} GB/s: {ours / plain:.0%} "
            "(goal >= 50 %)")  # fmt: skip


def commit_cost(evs: Events) -> dict[str, float]:
    blocks = [e for e in evs if e["ev"] == "block"]
    with_commits = statistics.mean(b["step_s"] for b in blocks if b["commits"])
    without = statistics.mean(b["step_s"] for b in blocks if not b["commits"])
    commits = [e["seconds"] for e in evs if e["ev"] == "commit"]
    copies = [e["copies"] for e in evs if e["ev"] == "commit" and e["copies"] > 0]
    return {
        "copies_s_median": statistics.median(copies),
        "step_s_without_commits": without,
        "step_s_commit_every_10": with_commits,
        "overhead_pct": (with_commits / without - 1) * 100,
        "commit_over_10_steps_pct": statistics.median(commits) / (10 * without) * 100,
        "commit_s_median": statistics.median(commits),
        "commit_s_max": max(commits),
    }


def peak_memory(evs: Events) -> list[tuple[int, float, float]]:
    """Per survivor: its rank, VmHWM before the kill and after recovery's first step (GiB)."""
    samples = [e for e in evs if e["ev"] == "memory"]
    rows = []
    steady_pids = {e["pid"] for e in samples if e["when"] == "steady"}  # not a restarted slot
    for pid in sorted({e["pid"] for e in samples if e["when"] == "recovered"} & steady_pids):
        mine = {e["when"]: e for e in samples if e["pid"] == pid}
        steady, recovered = mine["steady"], mine["recovered"]
        rows.append((steady["rank"], steady["vmhwm"] / GIB, recovered["vmhwm"] / GIB))
    return rows


def model_flags(args: argparse.Namespace) -> tuple[list[str], int]:
    dim = args.dim
    if args.params:
        dim = 64 * math.ceil(math.sqrt(args.params / args.layers) / 64)
    flags = ["--dim", str(dim), "--layers", str(args.layers), "--batch-size", str(args.batch)]
    flags += ["--block", str(args.block), "--blocks", str(args.blocks)]
    return flags, args.layers * (dim * dim + dim)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--params", type=float, help="about this many parameters (sets --dim)")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--block", type=int, default=20, help="steps per A/B block")
    parser.add_argument("--blocks", type=int, default=6, help="A/B blocks (even)")
    parser.add_argument(
        "--collective-timeout",
        type=float,
        help="ELASTICJOB_COLLECTIVE_TIMEOUT of the elastic job (default 60 s)",
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per job")
    parser.add_argument(
        "--paths", default="elastic,hsdp,restart", help="which jobs to run (comma-separated)"
    )
    parser.add_argument("--keep", type=Path, help="keep the jobs' output in this directory")
    parser.add_argument(
        "--sizes",
        help="model sizes (parameters, comma-separated, e.g. 10e6,30e6,100e6): each path's "
        "time to training resumed at each size, as a table (no commit-cost blocks)",
    )
    parser.add_argument("--plot", type=Path, help="with --sizes: the picture, as SVG")
    parser.add_argument(
        "--one-slot-hosts",
        action="store_true",
        help="the elastic path on 4 hosts of one slot: the killed rank's host goes and the 3 "
        "others reshard (on 2 hosts x 2 slots its slot restarts in place)",
    )
    parser.add_argument(
        "--no-huge-pages",
        action="store_true",
        help=f"{HUGE_PAGES}=0 for every process of every path (by default 1, as elasticjob "
        "gives its workers: torch's CPU tensors of 2 MB and more on transparent huge pages)",
    )
    args = parser.parse_args()
    if args.no_huge_pages:
        os.environ[HUGE_PAGES] = "0"
    began, load_before = time.monotonic(), os.getloadavg()
    paths = set(args.paths.split(","))
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.keep or Path(scratch)
        if args.sizes:
            args.blocks = 0
            by_size = {}
            for size in (float(s) for s in args.sizes.split(",")):
                args.params = size
                flags, params = model_flags(args)
                runs = run_paths(args, flags, paths, tmp / f"{size:g}")
                by_size[params] = resumed_by_path(runs)
                print(f"{params / 1e6:.1f} M parameters: " + ", ".join(
                    f"{path} {seconds:.2f} s" for path, seconds in by_size[params].items()
                ), flush=True)  # fmt: skip
                if "elastic" in runs:
                    print(reshard_bandwidth(runs["elastic"]), flush=True)
            report_sizes(args, by_size, load_before, time.monotonic() - began)
            return
        flags, params = model_flags(args)
        runs = run_paths(args, flags, paths, tmp)
    report(args, flags, params, runs, load_before, time.monotonic() - began)


def run_paths(args: argparse.Namespace, flags: list[str], paths: set[str], tmp: Path) -> Runs:
    """The jobs of ``paths`` for the model of ``flags``, their output under ``tmp``."""
    tmp.mkdir(parents=True, exist_ok=True)
    runs: Runs = {}
    if "elastic" in paths:
        hosts = ONE_SLOT_HOSTS if args.one_slot_hosts else HOSTS
        runs["elastic"], _ = run_elastic(
            tmp / "elastic", flags, args.timeout, args.collective_timeout, hosts
        )
    if "hsdp" in paths:
        hsdp_flags = [*flags[:4], "--batch-size", str(args.batch), "--hsdp", "--blocks",
                      "0", "--commit-every", "5", "--kill-rank", "7"]  # fmt: skip
        runs["hsdp"], _ = run_elastic(
            tmp / "hsdp", hsdp_flags, args.timeout, args.collective_timeout, HSDP_HOSTS
        )
    if "restart" in paths:
        runs["restart"] = run_restart(tmp / "restart", flags, args.timeout)
    return runs


PATH_NAMES = {
    "elastic": "elastic (rank 3 of 4 killed)",
    "hsdp": "HSDP (4 x 2 -> 3 x 2, nothing moves)",
    "restart": "torchrun restart + DCP reload",
}


def resumed_by_path(runs: Runs) -> dict[str, float]:
    """Each path's kill -> training resumed, in seconds."""
    return {
        path: (restart_kill(evs) if path == "restart" else elastic_kill(evs))["to training resumed"]
        for path, evs in runs.items()
    }


def report_sizes(
    args: argparse.Namespace,
    by_size: dict[int, dict[str, float]],
    load_before: tuple[float, float, float],
    took_s: float,
) -> None:
    load_after = os.getloadavg()[0]
    print(f"\nkill -> training resumed (s), wide MLP of {args.layers} layers, AdamW, Gloo on "
          f"the CPU; {os.cpu_count()} cores, load average {load_before[0]:.2f} before, "
          f"{load_after:.2f} after; torch {torch.__version__}; took {took_s:.0f} s; "
          f"huge pages {huge_pages()}")  # fmt: skip
    paths = list(next(iter(by_size.values())))
    print("| parameters | " + " | ".join(PATH_NAMES[p] for p in paths) + " |")
    print("|---:|" + "---:|" * len(paths))
    for params, resumed in by_size.items():
        cells = " | ".join(f"{resumed[p]:.2f}" for p in paths)
        print(f"| {params / 1e6:.1f} M | {cells} |")
    if args.plot:
        series = {
            PATH_NAMES[p]: [(params / 1e6, resumed[p]) for params, resumed in by_size.items()]
            for p in paths
        }
        title = f"Kill -> training resumed ({os.cpu_count()} cores for every rank)"
        line_chart(args.plot, title, "model parameters (millions)", "seconds", series)
        print(f"picture: {args.plot}")


def report(
    args: argparse.Namespace,
    flags: list[str],
    params: int,
    runs: dict[str, Events],
    load_before: tuple[float, float, float],
    took_s: float,
) -> None:
    load_after = os.getloadavg()
    print(f"model: wide MLP, {' '.join(flags[:4])}: {params / 1e6:.1f} M parameters, AdamW, "
          f"batch {args.batch}; Gloo on the CPU, 1 thread a rank")  # fmt: skip
    print(f"machine: {os.cpu_count()} cores, load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after; torch {torch.__version__}; took {took_s:.0f} s; "
          f"huge pages {huge_pages()}")  # fmt: skip
    resumed: dict[str, float] = {}
    titles = {
        "elastic": "a. elastic (ShardedState, 4 ranks): kill rank 3 (2 hosts x 2 slots: its "
        "slot restarts in place; --one-slot-hosts: its host goes, 4 -> 3 ranks)",
        "hsdp": "b. HSDP (4 hosts x 2 slots): kill 1 (its host, a replica, goes: 8 -> 6 ranks)",
    }
    for path, title in titles.items():
        if path in runs:
            parts = elastic_kill(runs[path])
            resumed[path] = parts["to training resumed"]
            print(f"\n{title}")
            for name, seconds in parts.items():
                print(f"   {name:<38} {seconds:8.3f} s")
    if "elastic" in runs:
        print(reshard_bandwidth(runs["elastic"]))
    if "hsdp" in runs:
        sent = max(e["sent_bytes"] for e in runs["hsdp"] if e["ev"] == "sync" and e["round"] == 2)
        print(f"   bytes sent by the reshard: {sent} (goal: 0); to training resumed "
              f"{resumed['hsdp']:.3f} s (goal <= 1 s)")  # fmt: skip
    if "restart" in runs:
        restart = restart_kill(runs["restart"])
        print("\nc. restart (torchrun, DCP on local disk): kill 1 of 4 -> restarted job's step")
        for name, seconds in restart.items():
            print(f"   {name:<38} {seconds:8.3f} s")
        saves = [e["seconds"] for e in runs["restart"] if e["ev"] == "saved"]
        print(f"   (the DCP save took {max(saves):.3f} s)")
        if "elastic" in resumed:
            ratio = restart["to training resumed"] / resumed["elastic"]
            print(f"   to training resumed, restart / elastic: {ratio:.2f}x (goal >= 5x)")
    if "elastic" in runs:
        elastic = runs["elastic"]
        c = commit_cost(elastic)
        print("\nd. commit cost (4 ranks, alternating blocks)")
        print(f"   step without commits {c['step_s_without_commits']:.3f} s, with a commit every "
              f"10 steps {c['step_s_commit_every_10']:.3f} s: {c['overhead_pct']:+.1f} % "
              f"(goal <= 5 %)")  # fmt: skip
        print(f"   one commit holds training up: median {c['commit_s_median']:.3f} s, max "
              f"{c['commit_s_max']:.3f} s; median / 10 steps without: "
              f"{c['commit_over_10_steps_pct']:.1f} %; its copies take median "
              f"{c['copies_s_median']:.3f} s beside training")  # fmt: skip
        print("e. peak memory (VmHWM) of each survivor: steady (4 ranks, after commits, with "
              "the snapshot and the copies) -> after recovery's first step")  # fmt: skip
        for rank, steady, recovered in peak_memory(elastic):
            print(f"   rank {rank}: {steady:.2f} GiB -> {recovered:.2f} GiB: "
                  f"{recovered / steady:.2f}x (goal <= 2.5x)")  # fmt: skip


if __name__ == "__main__":
    main()
