"""A sharded job on devcluster's real nodes: a pod's process killed, in place against replacing
every pod (prints its figures; asserts nothing).

The operator on a real-node devcluster (kubelets on containerd, the project's images); an
ElasticJob of the FSDP2 language model example (``examples/sharded_lm/train.py``) as HSDP:
two pods of two slots (each pod's processes shard the model, the pods replicate it), durable
checkpoints every few commits on a hostPath volume. Once the job has trained past a
checkpoint, the training process of one slot of the pod without rank 0 is SIGKILLed; the
figure is the time from the kill to *training resumed* (rank 0's line of the new round, which
it logs once the round's sync is done), read from the pods' log timestamps:

- ``in place``: what the operator does: the other pod keeps its processes and memory and
  trains on from the last in-memory commit (its replica holds every shard: nothing moves);
  with ``--pods 1`` (one replica), the killed slot restarts in its pod, whose other process
  keeps its memory, and takes its shard from that process's copy
  (``elasticjob/driver/slot_loss.py``);
- ``new pods``: what a controller that restarts a job by replacing its pods does (a
  PyTorchJob's restart policy, a JobSet's recreate): at the kill every pod of the job is
  deleted, and the pods the operator creates in their place start from the newest durable
  checkpoint on the volume (``torch.distributed.checkpoint``).

Usage: nice -n 5 python bench/sharded_pods.py [--repeat 2] [--dim 256] [--layers 4] [--pods 2]
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.real_node_operator import in_place_and_new_pods, operator_on_real_nodes  # noqa: E402
from tests.support.elastic_jobs import (  # noqa: E402
    KILL_ONE_SLOT,
    START_SERVER_READY,
    STARTUP_S,
    hsdp_job,
    status,
)
from tests.support.kube import Kube  # noqa: E402

BENCH_NET = 93
"""The devcluster network number of this benchmark's cluster (apart from the tests')."""
CHECKPOINTS = "/checkpoints"
COMPLETE = re.compile(r"ckpt-\d+-step-\d+")
"""A complete durable checkpoint's folder (one being written has a suffix)."""
ROUND_LINE = re.compile(r"round (\d+): (\d+) workers, from epoch (\d+) step (\d+)")


def manifest(name: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    train = [
        *("python", "examples/sharded_lm/train.py", "--hsdp"),
        *("--layers", str(args.layers), "--dim", str(args.dim), "--heads", "4"),
        *("--vocab", "256", "--seq-len", "64", "--batch-size", "8", "--epochs", "1000"),
        *("--commit-every", "5", "--log-every", "5", "--pace", "0.05"),
    ]
    checkpoints = {"name": "checkpoints", "hostPath": {"path": str(work), "type": "Directory"}}
    return hsdp_job(
        name,
        train,
        grace_s=5,
        volumes=[checkpoints],
        replicas=args.pods,
        maxReplicas=args.pods,
        blacklist={"scope": "Pod"},
        checkpoint={"volume": "checkpoints", "path": CHECKPOINTS, "everyCommits": 2},
    )


def round_lines(kube: Kube, selector: str) -> list[tuple[float, int]]:
    """Every rank 0 line of a new round in the job's pods' logs: (its time, the round)."""
    found = []
    for pod in kube.pods(selector):
        text = kube.kubectl("logs", pod["metadata"]["name"], "--timestamps", check=False)
        for line in text.splitlines():
            stamp, _, message = line.partition(" ")
            match = ROUND_LINE.search(message)
            if match:
                found.append((parse_stamp(stamp), int(match.group(1))))
    return found


def parse_stamp(stamp: str) -> float:
    """A log line's RFC 3339 time (nanoseconds cut to microseconds), in seconds."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    moment = datetime.datetime.fromisoformat(f"{whole}.{fraction[:6].ljust(6, '0')}+00:00")
    return moment.timestamp()


def one_run(kube: Kube, name: str, work: Path, args: argparse.Namespace, replace: bool) -> float:
    """Seconds from the kill to training resumed in this run's job."""
    selector = f"elasticjob.dev/job-name={name}"
    work.mkdir(parents=True)
    work.chmod(0o777)
    kube.apply(manifest(name, work, args))
    try:
        training = kube.wait(
            f"the job past its first checkpoint, with {args.pods} pod(s) of 2 slots",
            lambda: (
                (s := status(kube, name)).get("worldSize") == 2 * args.pods
                and s.get("phase") == "Running"
                and any(COMPLETE.fullmatch(found.name) for found in work.rglob("ckpt-*"))
                and s
            ),
            timeout=STARTUP_S,
        )
        pods = sorted(training["workers"], key=lambda w: 0 in w["ranks"])
        victim = pods[0]["pod"]  # one without rank 0, where there is one
        kube.wait(  # a slot restarted in place is forked from it
            "the pod's start server",
            lambda: START_SERVER_READY in kube.kubectl("logs", victim),
            timeout=60,
        )
        round_before = max(r for _, r in round_lines(kube, selector))
        _, killed = kube.kubectl("exec", victim, "--", "python", "-c", KILL_ONE_SLOT).split()
        killed_at = float(killed)  # the kill itself, not kubectl exec's start before it
        if replace:
            kube.kubectl("delete", "pods", "-l", selector, "--grace-period=0", "--force",
                         "--wait=false")  # fmt: skip
        resumed: float = kube.wait(
            "training resumed",
            lambda: min(
                (t for t, r in round_lines(kube, selector) if r > round_before and t > killed_at),
                default=None,
            ),
            timeout=STARTUP_S,
        )
        return resumed - killed_at
    finally:
        kube.kubectl("delete", "ej", name, "--wait=false", check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--pods", type=int, default=2, help="pods of 2 slots (replicas)")
    args = parser.parse_args()
    with operator_on_real_nodes("elasticjob-bench-sharded-", BENCH_NET) as (_, kube, run_dir):
        found = in_place_and_new_pods(
            args.repeat,
            lambda name, replace: one_run(kube, name, run_dir / name, args, replace),
            "kill to training resumed",
        )
        ratio = found["new pods"] / found["in place"]
        print(f"new pods / in place: {ratio:.1f}x (goal >= 10x)")


if __name__ == "__main__":
    main()
