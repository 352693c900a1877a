"""Restart mode on devcluster's real nodes against replacing every pod (prints its figures;
asserts nothing).

The operator on a real-node devcluster (kubelets on containerd, the project's images), an
ElasticJob in restart mode of 3 worker pods running the unchanged torchrun script of the
tests (``tests/integration/workers/restart_worker.py``, shared with the pods as a hostPath
volume, as the end-to-end tests do; it resumes from its checkpoint in the same folder). One
rank's script SIGKILLs itself once, after two epochs (8 s: restart mode's spare interpreter
for the next start is ready a few seconds after a start); the figure is the time from the
kill to every rank at its first step again:

- ``in place``: what restart mode does: every script starts again in its own pod;
- ``new pods``: what a controller that restarts a job by replacing its pods does (a
  PyTorchJob's restart policy, a JobSet's recreate): at the kill, every pod of the job is
  deleted, and the scripts start in the pods the operator creates in their place.

Usage: nice -n 5 python bench/restart_pods.py [--repeat 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.real_node_operator import in_place_and_new_pods, operator_on_real_nodes  # noqa: E402
from tests.support.elastic_jobs import job_manifest  # noqa: E402
from tests.support.job_runs import WORKERS, read_events  # noqa: E402
from tests.support.kube import Kube  # noqa: E402

REPLICAS = 3
BENCH_NET = 91
"""The devcluster network number of this benchmark's cluster (apart from the tests')."""


def manifest(name: str, work: Path) -> dict[str, Any]:
    script = [
        *("python", str(WORKERS / "restart_worker.py"), "--log-dir", str(work / "events")),
        *("--checkpoint", str(work / "ckpt.pt"), "--epochs", "3", "--steps", "40"),
        *("--step-s", "0.1", "--fail-at", "2:0:1:sigkill"),
    ]
    job = job_manifest(name, work / "events", work / "stop", command=script)
    job["spec"] |= {"mode": "restart", "replicas": REPLICAS, "minReplicas": REPLICAS}
    job["spec"] |= {"maxReplicas": REPLICAS, "blacklist": {"scope": "Pod"}}
    return job


def until(what: str, check: Callable[[], Any], timeout: float = 600) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)  # a benchmark's poll of the files the pods write
    raise SystemExit(f"timed out waiting for {what}")


def recovery(work: Path) -> float | None:
    """Seconds from the kill to every rank's first step after it (None: not yet)."""
    seen = read_events(work / "events")
    kills = [e["time"] for e in seen if e["ev"] == "kill"]
    if not kills:
        return None
    after = [e for e in seen if e["ev"] == "step" and e["time"] > kills[0]]
    firsts = [min((e["time"] for e in after if e["rank"] == r), default=None) for r in range(3)]
    return None if None in firsts else max(t for t in firsts if t is not None) - kills[0]


def one_run(kube: Kube, name: str, work: Path, replace_pods: bool) -> float:
    work.mkdir(parents=True)
    work.chmod(0o777)
    kube.apply(manifest(name, work))
    try:
        if replace_pods:
            until("the kill", lambda: any(e["ev"] == "kill" for e in read_events(work / "events")))
            kube.kubectl("delete", "pods", "-l", f"elasticjob.dev/job-name={name}",
                         "--grace-period=0", "--force", "--wait=false")  # fmt: skip
        figure: float = until("every rank at a step after the kill", lambda: recovery(work))
        return figure
    finally:
        kube.kubectl("delete", "ej", name, "--wait=false", check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    with operator_on_real_nodes("elasticjob-bench-restart-", BENCH_NET) as (_, kube, run_dir):
        found = in_place_and_new_pods(
            args.repeat,
            lambda name, replace: one_run(kube, name, run_dir / name, replace),
            "kill to every rank's first step",
        )
        ratio = found["in place"] / found["new pods"]
        print(f"in place / new pods: {ratio:.3f} (goal <= 0.3)")


if __name__ == "__main__":
    main()
