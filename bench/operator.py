"""Benchmark of the operator on devcluster (prints its figures; asserts nothing).

1. scale:  a training job of 2 workers scaled to 4 with `kubectl scale`: seconds to the first
           training step completed in the 4-worker world (skipped with ``--no-train``);
2. kill:   a worker of that job SIGKILLed: seconds to the first step completed in the new world;
3. many jobs (``operator_scale.py``): ``--jobs`` ElasticJobs of 4 idle workers each, created one
   after another (create -> 4 pods, p50/p99, the operator's CPU seconds and the watch events
   per second), idle (the operator's CPU share and RSS), a node failure that hits many jobs at
   once (-> every hit job's next round and 4 workers again, p50/p99), the operator's peak RSS.
   Their workers are played by one process (``pod_fleet.py``; each pod is a sleeping shell),
   over plain http (the chart's rendezvous TLS off), one node per 50 pods.

Usage: nice -n 5 python bench/operator.py [--jobs 200] [--no-train]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.operator_scale import ScaleBench, load  # noqa: E402
from devcluster.cluster import Cluster  # noqa: E402
from devcluster.config import ClusterConfig  # noqa: E402
from tests.support.job_runs import read_events  # noqa: E402

WORKER = REPO / "tests" / "integration" / "workers" / "elastic_worker.py"


def job(name: str, command: list[str], replicas: int, maximum: int) -> dict[str, Any]:
    return {
        "apiVersion": "elasticjob.dev/v1alpha1",
        "kind": "ElasticJob",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "minReplicas": 1,
            "maxReplicas": maximum,
            "backend": "gloo",
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "worker",
                            "image": "elasticjob/worker:0.1.0",
                            "command": command,
                            "resources": {"requests": {"cpu": "1m", "memory": "1Mi"}},
                        }
                    ]
                }
            },
        },
    }


class Bench:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        return self.cluster.kubectl(*args, input=stdin, timeout=120).stdout

    def apply(self, manifest: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))

    def pods(self, selector: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = json.loads(
            self.kubectl("get", "pods", "-l", selector, "-o", "json")
        )["items"]
        return items

    def status(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = (
            json.loads(self.kubectl("get", "ej", name, "-o", "json")).get("status") or {}
        )
        return found

    def until(
        self, what: str, check: Callable[[], Any], timeout: float = 300, poll: float = 0.05
    ) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            time.sleep(poll)
        raise SystemExit(f"timed out waiting for {what}")


def operator_pid() -> int:
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(part.endswith(b"elasticjob-operator") for part in cmdline[:2]):
                return int(proc.name)
    raise SystemExit("operator process not found")


def bench_scale_and_kill(bench: Bench, log_dir: Path) -> dict[str, float]:
    command = [
        "python",
        str(WORKER),
        "--log-dir",
        str(log_dir),
        "--epochs",
        "1000",
        "--samples",
        "96",
        "--stop-file",
        str(log_dir / "stop"),
    ]
    bench.apply(job("train", command, 2, 4))
    bench.until("training", lambda: bench.status("train").get("worldSize") == 2, poll=0.2)
    started = time.time()
    bench.kubectl("scale", "ej/train", "--replicas=4")
    first4 = bench.until(
        "a step in the 4-worker world",
        lambda: min(
            (e["time"] for e in read_events(log_dir) if e["ev"] == "step" and e["size"] == 4),
            default=None,
        ),
    )
    status = bench.status("train")
    victim = next(w for w in status["workers"] if 0 not in w["ranks"])
    round_before = max(e["round"] for e in read_events(log_dir) if e["ev"] == "step")
    killed = time.time()
    bench.cluster.faults.kill(victim["pod"], "default")
    after = bench.until(
        "a step in the next world",
        lambda: min(
            (
                e["time"]
                for e in read_events(log_dir)
                if e["ev"] == "step" and e["round"] > round_before
            ),
            default=None,
        ),
        timeout=120,
    )
    (log_dir / "stop").touch()
    return {"scale_to_first_step_s": first4 - started, "kill_to_first_step_s": after - killed}


def operator_address(bench: Bench) -> str:
    pods = json.loads(bench.kubectl("get", "pods", "-n", "elasticjob-system", "-o", "json"))
    return str(pods["items"][0]["status"]["podIP"])


def print_figures(what: str, figures: dict[str, float]) -> None:
    print(f"{what}: " + ", ".join(f"{k}={v:.3f}" for k, v in figures.items()) + f" ({load()})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--no-train", action="store_true", help="skip the training job")
    args = parser.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="elasticjob-bench-"))
    nodes = max(4, math.ceil(args.jobs * 4 / 50))
    cluster = Cluster(ClusterConfig.private(run_dir, 93, nodes=nodes, node_pods=110))
    cluster.up(timeout=900)
    scale: ScaleBench | None = None
    try:
        cluster.helm(
            "install",
            "elasticjob-operator",
            str(REPO / "deploy/helm/elasticjob-operator"),
            "-n",
            "elasticjob-system",
            "--create-namespace",
            "--set",
            "logLevel=warning",
            "--set",
            "rendezvous.tls.enabled=false",
            "--wait",
            "--timeout",
            "180s",
            timeout=240,
        )
        bench = Bench(cluster)
        if not args.no_train:
            figures = bench_scale_and_kill(bench, run_dir / "events")
            print_figures("train", figures)
            bench.kubectl("delete", "ej", "train", "--wait=false")
        scale = ScaleBench(cluster.kubeconfig, run_dir, operator_pid(), operator_address(bench))
        print_figures("create", scale.create(args.jobs))
        print_figures("idle", scale.idle())
        print_figures("node failure", scale.node_failure(cluster.faults.node_delete))
        print_figures("operator", {"peak_rss_mib": scale.memory_mib("VmHWM")})
    finally:
        if scale is not None:
            scale.close()
        cluster.down()


if __name__ == "__main__":
    main()
