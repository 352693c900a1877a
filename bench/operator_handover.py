"""The operator's handover on devcluster's real nodes: a standby against a lone replica
(prints its figures; asserts nothing).

The chart's defaults (two replicas; the Lease's 3 s, 2 s and 0.5 s) and an ElasticJob of two
worker pods training (the tests' worker script, shared with the pods as a hostPath volume, as
the end-to-end tests do). The leading operator's container is SIGKILLed; the figure is the time
from just before the kill until the rendezvous Service routes to one operator pod and that pod
answers the job's round (``tests.support.operator_release.wait_handover``, which looks every
50 ms with a few kubectl round trips: the figures carry their latency):

- ``standby``: two replicas: the standby takes the Lease once it runs out and serves;
- ``one replica``: ``replicas: 1`` (what the chart ran before): the kubelet restarts the killed
  container, which starts, becomes ready, waits for its predecessor's Lease to run out and
  serves.

Usage: nice -n 5 python bench/operator_handover.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.real_node_operator import medians, operator_on_real_nodes  # noqa: E402
from devcluster.cluster import Cluster  # noqa: E402
from tests.support.elastic_jobs import STARTUP_S, job_manifest, status  # noqa: E402
from tests.support.kube import Kube  # noqa: E402
from tests.support.operator_release import (  # noqa: E402
    CHART,
    RELEASE,
    SYSTEM_NS,
    leader_pod,
    ready_operator_pods,
    wait_handover,
)

BENCH_NET = 92
"""The devcluster network number of this benchmark's cluster (apart from the tests')."""
JOB = "handover"


def set_replicas(cluster: Cluster, kube: Kube, replicas: int) -> None:
    cluster.helm(
        "upgrade", RELEASE, str(CHART), "-n", SYSTEM_NS, "--reuse-values",
        "--set", f"replicas={replicas}", "--wait", "--timeout", "300s", timeout=360,
    )  # fmt: skip
    kube.wait(
        f"{replicas} ready operator replica(s), one leading",
        lambda: len(ready_operator_pods(cluster)) == replicas and leader_pod(cluster),
        timeout=300,
    )


def one_kill(cluster: Cluster, kube: Kube, replicas: int) -> float:
    """SIGKILL the leader; seconds until an operator serves the job again."""
    leader = kube.wait("the leader", lambda: leader_pod(cluster), timeout=120)
    name = leader["metadata"]["name"]
    started = time.monotonic()
    cluster.faults.kill(name, SYSTEM_NS)
    _, seconds = wait_handover(kube, JOB, started, old=name if replicas > 1 else None)
    kube.wait(
        "every replica ready again",
        lambda: len(ready_operator_pods(cluster)) == replicas,
        timeout=300,
    )
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    bench = operator_on_real_nodes("elasticjob-bench-handover-", BENCH_NET)
    with bench as (cluster, kube, run_dir):
        work = run_dir / "job"
        work.mkdir()
        work.chmod(0o777)
        kube.apply(job_manifest(JOB, work / "events", work / "stop", replicas=2, minReplicas=2))
        kube.wait(
            "the job training",
            lambda: status(kube, JOB).get("phase") == "Running",
            timeout=STARTUP_S,
        )
        results: dict[str, list[float]] = {}
        for what, replicas in (("standby", 2), ("one replica", 1)):
            set_replicas(cluster, kube, replicas)
            for k in range(args.repeat):
                figure = one_kill(cluster, kube, replicas)
                results.setdefault(what, []).append(figure)
                print(f"{what} run {k}: SIGKILL to serving the job {figure:.2f} s", flush=True)
        found = medians(results)
        ratio = found["standby"] / found["one replica"]
        print(f"standby / one replica: {ratio:.3f} (goal: standby within 5 s)")


if __name__ == "__main__":
    main()
