"""Benchmark of the operator on devcluster (prints its figures; asserts nothing).

1. create: ElasticJobs of 4 worker pods created one after another; seconds from the create
   call to the job's 4th pod existing (median, p99);
2. idle:   the operator's CPU (share of one core) and memory with those jobs running, their
   workers idle in their rounds (``idle_worker.py``: the protocol without training);
3. scale:  a training job of 2 workers scaled to 4 with `kubectl scale`: seconds to the first
           training step completed in the 4-worker world;
4. kill:   a worker of that job SIGKILLed: seconds to the first step completed in the new world.

Usage: python bench/operator.py [--jobs 50]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from devcluster import Cluster, ClusterConfig  # noqa: E402
from tests.integration.harness import read_events  # noqa: E402

WORKER = REPO / "tests" / "integration" / "workers" / "elastic_worker.py"
IDLE = REPO / "bench" / "idle_worker.py"


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


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def bench_create_and_idle(bench: Bench, jobs: int) -> dict[str, float]:
    durations = []
    for i in range(jobs):
        started = time.monotonic()
        bench.apply(job(f"idle-{i}", ["python", str(IDLE)], 4, 4))
        bench.until(
            f"4 pods of idle-{i}",
            lambda i=i: len(bench.pods(f"elasticjob.dev/job-name=idle-{i}")) >= 4,
        )  # type: ignore[misc]
        durations.append(time.monotonic() - started)
    bench.until(
        "every idle job running",
        lambda: all(bench.status(f"idle-{i}").get("phase") == "Running" for i in range(jobs)),
        timeout=600,
        poll=2,
    )
    pid = operator_pid()
    cpu_before, wall_before = cpu_seconds(pid), time.monotonic()
    time.sleep(30)  # the measurement window itself
    cpu = (cpu_seconds(pid) - cpu_before) / (time.monotonic() - wall_before)
    ordered = sorted(durations)
    return {
        "jobs": jobs,
        "create_to_pods_median_s": statistics.median(ordered),
        "create_to_pods_p99_s": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "operator_cpu_share_of_one_core": cpu,
        "operator_rss_mib": rss_mib(pid),
    }


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=50)
    args = parser.parse_args()
    run_dir = Path(tempfile.mkdtemp(prefix="elasticjob-bench-"))
    cluster = Cluster(ClusterConfig.private(run_dir, 93, nodes=4, node_pods=110))
    cluster.up(timeout=900)
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
            "--wait",
            "--timeout",
            "180s",
            timeout=240,
        )
        bench = Bench(cluster)
        figures = bench_scale_and_kill(bench, run_dir / "events")
        print("train: " + ", ".join(f"{k}={v:.3f}" for k, v in figures.items()), flush=True)
        bench.kubectl("delete", "ej", "train", "--wait=false")
        figures = bench_create_and_idle(bench, args.jobs)
        print("idle: " + ", ".join(f"{k}={v:.3f}" for k, v in figures.items()), flush=True)
    finally:
        cluster.down()


if __name__ == "__main__":
    main()
