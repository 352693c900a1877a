"""Convergence benchmark: does an elastic run train as an uninterrupted one? (prints its
figures and draws the loss curves; asserts nothing)

Two workloads of ``convergence_worker.py`` under ``elasticjob-run``, Gloo on loopback, one
thread a worker: the digits MLP (elastic DDP, SGD with momentum, a per-worker batch of 8)
and the sharded language model of ``examples/sharded_lm`` (FSDP2, AdamW, 2 blocks, 8
sequences a worker). Each trains the same number of samples, the same seed, three ways:

1. **uninterrupted** at 4 workers (the reference), and again with other seeds (initialization
   and data order): how far apart runs that differ by chance alone end, the noise;
2. **elastic**: the same job through random events, at least five SIGKILLs (of rank 0 or 1,
   in the middle of a step) and five resizes between 2 and 4 workers (a host discovery that
   follows the samples trained); a killed worker's host is blacklisted for a second or two,
   so each kill is also a scale-in and, soon after, a scale-out. The global batch follows
   the world (a per-worker batch; the digits learning rate scales with the world, as Horovod
   advises);
3. **elastic, fixed global batch**: the same events, with ``GlobalBatchSampler`` (the global
   batch of 4 workers, micro-batches of the per-worker batch, accumulated).

For each run: the final loss on held-out data (the digits' accuracy), the largest gap between
its loss curve and the reference's (each curve the committed trajectory's per-step losses,
averaged over 40 bins of samples trained), resets and wall time. The noise is the spread of
the seeds' final losses and their curves' largest gap. Goal: the fixed-global-batch run ends
within that noise.

Usage: python bench/convergence.py [--workloads digits,lm] [--seeds 3] [--events-seed 7]
                                   [--plot docs/convergence.png] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from tests.support.job_runs import loopback_hosts, run_to_end, write_discovery  # noqa: E402

WORKER = HERE / "convergence_worker.py"
LAUNCHER = [sys.executable, "-m", "elasticjob.launcher.run_command"]
BINS = 40
COOLDOWN_S = ("1", "2")
"""A killed worker's host comes back after a second or two: a resize then never lists only
hosts in their cooldown (a job of two that lost both would end)."""


@dataclass(frozen=True)
class Workload:
    name: str
    samples: int  # of one epoch
    batch: int
    epochs: int
    pace: float  # seconds added to each step, for the host discovery to keep up


WORKLOADS = {
    "digits": Workload("digits", 1797, 8, 6, 0.03),
    "lm": Workload("lm", 1024, 8, 4, 0.0),
}


@dataclass
class Run:
    label: str
    curve: list[tuple[int, float]]  # (samples trained, step loss) of the committed trajectory
    end: dict[str, float]
    resets: int
    seconds: float
    kills_fired: int = 0
    sizes: set[int] = field(default_factory=set)

    def binned(self, total: int) -> list[float | None]:
        """The curve's mean loss in each of :data:`BINS` equal ranges of samples trained."""
        sums, counts = [0.0] * BINS, [0] * BINS
        for samples, loss in self.curve:
            index = min((samples - 1) * BINS // total, BINS - 1)
            sums[index] += loss
            counts[index] += 1
        return [s / c if c else None for s, c in zip(sums, counts, strict=True)]


def gap(a: Run, b: Run, total: int) -> float:
    """The largest difference between two binned loss curves."""
    pairs = zip(a.binned(total), b.binned(total), strict=True)
    return max(abs(x - y) for x, y in pairs if x is not None and y is not None)


def elastic_events(total: int, seed: int) -> tuple[list[tuple[int, int]], dict[int, str]]:
    """Five kills (samples, rank 0 or 1) and five resizes (samples -> 2, 3 or 4 hosts), in a
    random order, one in each tenth of the span from 10 % to 90 % of training, at least a
    twentieth of training apart: a resize is in effect (the discovery seen, the dismissed
    workers gone) before the next kill, which could otherwise hit the one survivor of a job
    whose other workers are on their way out (it then ends: no live state is left)."""
    rng = random.Random(seed)
    width = total * 0.8 / 10
    points = [int(total * 0.1 + i * width + rng.uniform(0, width / 3)) for i in range(10)]
    kinds = ["kill"] * 5 + ["resize"] * 5
    rng.shuffle(kinds)
    kills: list[tuple[int, int]] = []
    schedule = {0: loopback_hosts(4)}
    hosts = 4
    for point, kind in zip(points, kinds, strict=True):
        if kind == "kill":
            kills.append((point, rng.choice((0, 1))))
        else:
            hosts = rng.choice([n for n in (2, 3, 4) if n != hosts])
            schedule[point] = loopback_hosts(hosts)
    return kills, schedule


def run_job(directory: Path, workload: Workload, mode: str, seed: int, events: Any | None) -> Run:
    log_dir = directory / "events"
    worker = [sys.executable, str(WORKER), "--log-dir", str(log_dir),
              "--workload", workload.name, "--mode", mode, "--batch", str(workload.batch),
              "--epochs", str(workload.epochs), "--seed", str(seed),
              "--pace", str(workload.pace)]  # fmt: skip
    if events is None:
        launcher = [*LAUNCHER, "-np", "4", "-H", loopback_hosts(4)]
    else:
        kills, schedule = events
        script, epoch_file = write_discovery(directory, schedule)
        launcher = [*LAUNCHER, "-np", "4", "--min-np", "2", "--max-np", "4",
                    "--host-discovery-script", str(script),
                    "--blacklist-cooldown-range", *COOLDOWN_S]  # fmt: skip
        worker += ["--epoch-file", str(epoch_file),
                   "--kills", ",".join(f"{s}:{r}" for s, r in kills)]  # fmt: skip
    started = time.monotonic()
    returncode, stdout, stderr = run_to_end([*launcher, *worker], directory, None, 1800.0)
    seconds = time.monotonic() - started
    (directory / "launcher.log").write_text(stderr + stdout)
    if returncode != 0:
        raise SystemExit(f"{directory.name}: exit {returncode}\n{stderr[-3000:]}")
    texts = [path.read_text() for path in log_dir.glob("*.jsonl")]
    lines = [json.loads(line) for text in texts for line in text.split("\n") if line]
    lines.sort(key=lambda e: e["time"])
    committed: list[dict[str, Any]] = []
    for event in (e for e in lines if e["ev"] == "step"):
        while committed and committed[-1]["samples"] >= event["samples"]:
            committed.pop()  # rolled back, or the step taken again
        committed.append(event)
    resets = re.search(r"after \d+ rounds and (\d+) resets", stderr)
    return Run(
        label="",
        curve=[(e["samples"], e["loss"]) for e in committed],
        end=next(e for e in lines if e["ev"] == "end"),
        resets=int(resets.group(1)) if resets else -1,
        seconds=seconds,
        kills_fired=len(list(log_dir.glob("killed-*"))),
        sizes={e["size"] for e in committed},
    )


def bench(workload: Workload, seeds: int, events_seed: int, root: Path) -> dict[str, Run]:
    total = workload.samples * workload.epochs
    events = elastic_events(total, events_seed)
    print(f"\n{workload.name}: {workload.epochs} epochs of {workload.samples} samples; "
          f"kills (samples:rank) {events[0]}; hosts from samples "
          f"{ {k: v.count(',') + 1 for k, v in events[1].items()} }", flush=True)  # fmt: skip
    runs: dict[str, Run] = {}
    plan = [(f"uninterrupted seed {s}", "worker", s, None) for s in range(seeds)]
    plan += [("elastic", "worker", 0, events), ("elastic, fixed global batch", "global", 0, events)]
    for label, mode, seed, schedule in plan:
        directory = root / workload.name / re.sub(r"\W+", "-", label)
        directory.mkdir(parents=True)
        run = run_job(directory, workload, mode, seed, schedule)
        run.label = label
        runs[label] = run
        print(f"  ran {label}: {run.seconds:.0f} s", flush=True)
    return runs


def report(workload: Workload, runs: dict[str, Run]) -> None:
    total = workload.samples * workload.epochs
    reference = runs["uninterrupted seed 0"]
    seeds = [r for label, r in runs.items() if label.startswith("uninterrupted")]
    finals = [r.end["loss"] for r in seeds]
    noise_final = max(finals) - min(finals)
    noise_gap = max((gap(a, b, total) for a in seeds for b in seeds if a is not b), default=0.0)
    accuracy = "accuracy" in reference.end
    print(f"\n{workload.name}: {'run':<30} {'final loss':>10} "
          f"{'accuracy' if accuracy else '':>8} {'vs ref':>8} {'curve gap':>9} "
          f"{'resets':>6} {'kills':>5} {'worlds':>8} {'time':>6}")  # fmt: skip
    for label, run in runs.items():
        acc = f"{run.end['accuracy']:.3f}" if accuracy else ""
        delta = run.end["loss"] - reference.end["loss"]
        print(f"{'':{len(workload.name) + 1}} {label:<30} {run.end['loss']:>10.4f} {acc:>8} "
              f"{delta:>+8.1e} {gap(run, reference, total):>9.2e} {run.resets:>6} "
              f"{run.kills_fired:>5} {','.join(map(str, sorted(run.sizes))):>8} "
              f"{run.seconds:>5.0f}s")  # fmt: skip
    print(f"  noise over {len(seeds)} seeds: final loss spread {noise_final:.4f}, "
          f"largest curve gap {noise_gap:.4f}")  # fmt: skip
    for label in ("elastic", "elastic, fixed global batch"):
        run = runs[label]
        delta = abs(run.end["loss"] - reference.end["loss"])
        curve = gap(run, reference, total)
        within = delta <= noise_final and curve <= noise_gap
        print(f"  {label}: final loss {delta:.4f} from the reference "
              f"({ratio(delta, noise_final)} the spread), curve gap {ratio(curve, noise_gap)} "
              f"the seeds' -> {'within' if within else 'OUTSIDE'} the noise")  # fmt: skip


def ratio(value: float, noise: float) -> str:
    return f"{value / noise:.2f}x" if noise else "inf x"


def plot(results: dict[Workload, dict[str, Run]], path: Path) -> None:
    try:
        import matplotlib  # noqa: PLC0415 (an optional dependency)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        print("(matplotlib is not installed: no picture; pip install elasticjob[plot])")
        return
    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, (workload, runs) in zip(axes[0], results.items(), strict=True):
        total = workload.samples * workload.epochs
        centers = [(i + 0.5) * total / BINS / workload.samples for i in range(BINS)]
        for label, run in runs.items():
            points = [
                (x, y) for x, y in zip(centers, run.binned(total), strict=True) if y is not None
            ]
            if label.startswith("uninterrupted"):
                style: dict[str, Any] = {"color": "0.6", "linewidth": 1}
                style["label"] = (
                    "uninterrupted, 4 workers (seeds)" if label.endswith(" 0") else None
                )
            elif "global" in label:
                style = {"color": "C0", "linewidth": 2, "label": label}
            else:
                style = {"color": "C1", "linewidth": 2, "label": label}
            ax.plot(*zip(*points, strict=True), **style)
        ax.set_yscale("log")
        ax.set_xlabel("epochs trained")
        ax.set_ylabel("training loss (mean over 1/40 of the run)")
        ax.set_title(f"{workload.name}: 5 SIGKILLs, 5 resizes between 2 and 4 workers")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"\npicture: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", default="digits,lm")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--events-seed", type=int, default=7)
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--keep", type=Path, help="keep the runs' logs here")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="convergence-"))
    results = {}
    for name in args.workloads.split(","):
        workload = WORKLOADS[name]
        results[workload] = bench(workload, args.seeds, args.events_seed, root)
    for workload, runs in results.items():
        report(workload, runs)
    if args.plot is not None:
        plot(results, args.plot)
    print(f"logs: {root}")


if __name__ == "__main__":
    main()
