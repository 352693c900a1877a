"""The many-jobs part of the operator benchmark (``bench/operator.py``): ElasticJobs of 4 idle
workers each, their pods played by one process (``pod_fleet.py``).

1. create: the jobs created one after another; seconds from the create call to the job's 4th
   pod existing (the pod watch's ADDED), p50 and p99; the operator's CPU seconds and the watch
   events (worker pods and ElasticJobs) per second over the phase;
2. idle:   the operator's CPU (share of one core) with every job running, over 30 s, and the
   API server's requests a second over the same window (from its ``apiserver_request_total``),
   the most frequent kinds by verb and resource;
3. node failure: the node with the most jobs' pods deleted (its processes killed, its pods
   removed): seconds to every hit job's next round (survivors re-formed) and to 4 workers again
   (p50, p99);
and the operator's peak RSS, the load average after each phase.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes
from kubernetes.watch.watch import iter_resp_lines

from bench.pod_fleet import SHIM, SPOOL_ENV
from elasticjob.operator.api import GROUP, LABEL_JOB_NAME, PLURAL, VERSION

BENCH = Path(__file__).resolve().parent

NAMESPACE = "default"
WORKER_SELECTOR = "elasticjob.dev/role=worker"
IDLE_WINDOW_S = 30.0
IDLE_TOP_REQUESTS = 6
LABEL = re.compile(r'(\w+)="([^"]*)"')
HEARTBEAT_TIMEOUT_S = 30


@dataclass
class Seen:
    """What the benchmark's watches saw (``time.monotonic()``), under ``lock``."""

    lock: threading.Condition = field(default_factory=threading.Condition)
    pods: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    """Job -> names of its pods seen."""
    fourth_pod: dict[str, float] = field(default_factory=dict)
    status: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Job -> its latest status."""
    formed: dict[str, list[tuple[float, int, int]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    """Job -> (when, round, worldSize) at each change of either."""
    node_of: dict[str, str] = field(default_factory=dict)
    """Pod -> node."""
    job_of: dict[str, str] = field(default_factory=dict)
    events: int = 0

    def on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        job, name = meta.get("labels", {}).get(LABEL_JOB_NAME, ""), meta["name"]
        with self.lock:
            self.events += 1
            if kind == "DELETED":
                self.node_of.pop(name, None)
            elif node := (pod.get("spec") or {}).get("nodeName"):
                self.node_of[name], self.job_of[name] = node, job
            self.pods[job].add(name)
            if len(self.pods[job]) >= 4:
                self.fourth_pod.setdefault(job, time.monotonic())
            self.lock.notify_all()

    def on_job(self, kind: str, job: dict[str, Any]) -> None:
        name, status = job["metadata"]["name"], job.get("status") or {}
        with self.lock:
            self.events += 1
            self.status[name] = status
            entry = (int(status.get("round") or 0), int(status.get("worldSize") or 0))
            history = self.formed[name]
            if not history or history[-1][1:] != entry:
                history.append((time.monotonic(), *entry))
            self.lock.notify_all()

    def wait(self, what: str, check: Callable[[], bool], timeout: float) -> None:
        with self.lock:
            if not self.lock.wait_for(check, timeout):
                raise SystemExit(f"timed out waiting for {what}")


def watch(list_call: Callable[..., Any], handle: Callable[[str, dict[str, Any]], None]) -> None:
    """Follow a watch as raw JSON for good (a thread), resuming at the last version seen."""
    version = None
    while True:
        try:
            response = list_call(
                watch=True,
                resource_version=version,
                timeout_seconds=300,
                _preload_content=False,
            )
            for line in iter_resp_lines(response):
                event = json.loads(line)
                if event["type"] == "ERROR":
                    version = None
                    break
                version = event["object"]["metadata"]["resourceVersion"]
                handle(event["type"], event["object"])
        except Exception as exc:  # the benchmark goes on watching
            print(f"watch restarted: {exc!r}", file=sys.stderr, flush=True)
            time.sleep(0.5)


def idle_job(name: str, spool: Path) -> dict[str, Any]:
    container = {
        "name": "worker",
        "image": "elasticjob/worker:0.1.0",
        "command": ["sh", "-c", SHIM],
        "env": [{"name": SPOOL_ENV, "value": str(spool)}],
        "resources": {"requests": {"cpu": "1m", "memory": "1Mi"}},
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ElasticJob",
        "metadata": {"name": name},
        "spec": {
            "replicas": 4,
            "minReplicas": 1,
            "maxReplicas": 4,
            "backend": "gloo",
            # Workers beat every 2 s, not 1 s, and a beat late by up to 30 s is no eviction:
            # on a loaded machine the load side is late before the operator is.
            "heartbeatTimeoutSeconds": HEARTBEAT_TIMEOUT_S,
            "template": {"spec": {"containers": [container]}},
        },
    }


def percentiles(values: list[float]) -> tuple[float, float, float]:
    """p50, p99 and the maximum."""
    ordered = sorted(values)
    return statistics.median(ordered), ordered[int(0.99 * (len(ordered) - 1))], ordered[-1]


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.2f} {five:.2f} {fifteen:.2f}"


class ScaleBench:
    """The phases (see the module docstring) on a cluster with the operator installed."""

    def __init__(self, kubeconfig: Path, run_dir: Path, operator: int, address: str) -> None:
        kubernetes.config.load_kube_config(str(kubeconfig))
        self.kubeconfig, self.run_dir = kubeconfig, run_dir
        self.core = kubernetes.client.CoreV1Api()
        self.custom = kubernetes.client.CustomObjectsApi()
        self.operator = operator
        self.seen = Seen()
        self.spool = run_dir / "spool"
        self.spool.mkdir()
        self.fleet = subprocess.Popen(
            [sys.executable, str(BENCH / "pod_fleet.py"), "--spool", str(self.spool),
             "--address", address]
        )  # fmt: skip
        pods = lambda **kw: self.core.list_namespaced_pod(  # noqa: E731
            NAMESPACE, label_selector=WORKER_SELECTOR, **kw
        )
        jobs = lambda **kw: self.custom.list_namespaced_custom_object(  # noqa: E731
            GROUP, VERSION, NAMESPACE, PLURAL, **kw
        )
        for call, handle in ((pods, self.seen.on_pod), (jobs, self.seen.on_job)):
            threading.Thread(target=watch, args=(call, handle), daemon=True).start()

    def close(self) -> None:
        self.fleet.kill()
        self.fleet.wait()

    def cpu(self) -> float:
        fields = Path(f"/proc/{self.operator}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def memory_mib(self, key: str) -> float:
        for line in Path(f"/proc/{self.operator}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def create(self, jobs: int) -> dict[str, float]:
        names = [f"idle-{i}" for i in range(jobs)]
        durations = []
        cpu, events, began = self.cpu(), self.seen.events, time.monotonic()
        for name in names:
            started = time.monotonic()
            self.custom.create_namespaced_custom_object(
                GROUP, VERSION, NAMESPACE, PLURAL, idle_job(name, self.spool)
            )
            self.seen.wait(f"4 pods of {name}", lambda n=name: n in self.seen.fourth_pod, 120)  # type: ignore[misc]
            durations.append(self.seen.fourth_pod[name] - started)
            if len(durations) % 50 == 0:  # a partial figure, should the run be cut short
                p50, p99, _ = percentiles(durations[-50:])
                print(f"  jobs {len(durations) - 49}-{len(durations)}: create_to_pods "
                      f"p50={p50:.3f} p99={p99:.3f} ({load()})", flush=True)  # fmt: skip
        elapsed = time.monotonic() - began
        p50, p99, worst = percentiles(durations)
        figures = {
            "jobs": jobs,
            "create_to_pods_p50_s": p50,
            "create_to_pods_p99_s": p99,
            "create_to_pods_max_s": worst,
            "phase_s": elapsed,
            "operator_cpu_s": self.cpu() - cpu,
            "watch_events_per_s": (self.seen.events - events) / elapsed,
        }
        self.seen.wait(
            "every job running with 4 workers",
            lambda: all(self.seen.status.get(n, {}).get("worldSize") == 4 for n in names),
            600,
        )
        return figures

    def api_requests(self) -> Counter[str]:
        """The API server's requests so far, by ``verb resource[/subresource]``."""
        metrics = subprocess.run(
            [str(self.run_dir / "bin" / "kubectl"), "--kubeconfig", str(self.kubeconfig),
             "get", "--raw", "/metrics"],
            check=True, capture_output=True, text=True, timeout=60,
        ).stdout  # fmt: skip
        counts: Counter[str] = Counter()
        for line in metrics.splitlines():
            if line.startswith("apiserver_request_total{"):
                labels = dict(LABEL.findall(line))
                kind = labels.get("resource", "") + (
                    f"/{labels['subresource']}" if labels.get("subresource") else ""
                )
                counts[f"{labels.get('verb', '?')} {kind}"] += int(float(line.rsplit(" ", 1)[1]))
        return counts

    def idle(self) -> dict[str, float]:
        cpu, requests, began = self.cpu(), self.api_requests(), time.monotonic()
        time.sleep(IDLE_WINDOW_S)  # the measurement window itself
        elapsed = time.monotonic() - began
        figures = {
            "operator_cpu_share_of_one_core": (self.cpu() - cpu) / elapsed,
            "operator_rss_mib": self.memory_mib("VmRSS"),
        }
        rates = self.api_requests() - requests
        figures["api_requests_per_s"] = sum(rates.values()) / elapsed
        for kind, count in rates.most_common(IDLE_TOP_REQUESTS):
            figures[f"api {kind} per_s"] = count / elapsed
        return figures

    def node_failure(self, delete_node: Callable[[str], None]) -> dict[str, float]:
        with self.seen.lock:
            by_node: dict[str, set[str]] = defaultdict(set)
            for pod, node in self.seen.node_of.items():
                by_node[node].add(self.seen.job_of[pod])
            node, hit = max(by_node.items(), key=lambda item: len(item[1]))
            before = {job: int(self.seen.status[job].get("round") or 0) for job in hit}
        cpu, events, began = self.cpu(), self.seen.events, time.monotonic()
        delete_node(node)

        def after(job: str, size: int | None) -> float | None:
            return next(
                (t for t, r, w in self.seen.formed[job]
                 if t >= began and r > before[job] and w > 0 and (size is None or w == size)),
                None,
            )  # fmt: skip

        self.seen.wait("every hit job at 4 workers", lambda: all(after(j, 4) for j in hit), 600)
        elapsed = time.monotonic() - began
        reformed = [after(job, None) or 0.0 for job in hit]
        full = [after(job, 4) or 0.0 for job in hit]
        p50, p99, _ = percentiles([t - began for t in reformed])
        f50, f99, _ = percentiles([t - began for t in full])
        return {
            "jobs_hit": len(hit),
            "to_next_round_p50_s": p50,
            "to_next_round_p99_s": p99,
            "to_4_workers_p50_s": f50,
            "to_4_workers_p99_s": f99,
            "operator_cpu_s": self.cpu() - cpu,
            "watch_events_per_s": (self.seen.events - events) / elapsed,
        }
