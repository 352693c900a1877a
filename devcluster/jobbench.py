"""The operator's figures on real nodes, for ``python -m devcluster bench --runtime containerd``.

On a running real-node cluster: the operator installed with its chart, the digits example
(from the worker image) as an ElasticJob of 2 workers, then

- ``kubectl scale`` 2 -> 4: from the command until the first worker of the round of 4 has
  synced the state (its first step starts right after);
- a worker partitioned from its peers (it still reaches the rendezvous), then a worker's
  SIGKILL: from the fault until the first survivor of the next round has synced.

Times come from the kubelet's timestamps on the workers' log lines (``kubectl logs
--timestamps``) against this machine's clock, which the containers share.
"""

from __future__ import annotations

import datetime
import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any

from devcluster.cluster import Cluster
from devcluster.config import REPO_ROOT
from devcluster.imagebuild import worker_image

logger = logging.getLogger(__name__)

RELEASE = "elasticjob-operator"
SYSTEM_NS = "elasticjob-system"
JOB = "bench"
SYNCED = re.compile(r"^(\S+) \[\S+ round=(\d+) rank=\d+ step=\d+\] state synced from rank 0")
JOINED = re.compile(r"^\S+ \[\S+ round=(\d+) rank=\d+ step=\d+\] \S+ joined round")


def _job(workers: int) -> dict[str, Any]:
    command = ["python", "examples/digits/train.py", "--epochs", "100000", "--pace", "0.05"]
    return {
        "apiVersion": "elasticjob.dev/v1alpha1",
        "kind": "ElasticJob",
        "metadata": {"name": JOB, "namespace": "default"},
        "spec": {
            "replicas": workers,
            "minReplicas": 2,
            "maxReplicas": 4,
            "backend": "gloo",
            "heartbeatTimeoutSeconds": 3,
            "blacklist": {"cooldownSeconds": {"min": 1, "max": 2}},
            "template": {
                "spec": {
                    "terminationGracePeriodSeconds": 10,
                    "containers": [{"name": "worker", "image": worker_image(), "command": command}],
                }
            },
        },
    }


def _status(cluster: Cluster) -> dict[str, Any]:
    found = cluster.kubectl("get", "ej", JOB, "-o", "json", check=False)
    if found.returncode != 0:
        return {}
    status: dict[str, Any] = json.loads(found.stdout).get("status") or {}
    return status


def _until(
    cluster: Cluster, what: str, check: Callable[[dict[str, Any]], bool], timeout: float = 300
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = _status(cluster)
        if check(status):
            return status
        time.sleep(0.2)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")


def _logs(cluster: Cluster, pod: str) -> list[str]:
    return cluster.kubectl("logs", pod, "--timestamps", check=False).stdout.splitlines()


def _first_sync_after(
    cluster: Cluster, after: float, round_: int, without: str | None = None, timeout: float = 120
) -> float:
    """The wall-clock time of the first "state synced" line of round ``round_`` or later
    logged by any worker after ``after``; ``without``: only of rounds that pod never joined."""
    joined: set[int] = set()
    if without is not None:
        joined = {int(m.group(1)) for line in _logs(cluster, without) if (m := JOINED.match(line))}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = json.loads(
            cluster.kubectl(
                "get", "pods", "-l", f"elasticjob.dev/job-name={JOB}", "-o", "json"
            ).stdout
        )["items"]
        times = []
        for pod in pods:
            for line in _logs(cluster, pod["metadata"]["name"]):
                if (m := SYNCED.match(line)) and int(m.group(2)) >= round_:
                    if int(m.group(2)) in joined:
                        continue
                    stamp = datetime.datetime.fromisoformat(m.group(1)[:26].rstrip("Z") + "+00:00")
                    if stamp.timestamp() > after:
                        times.append(stamp.timestamp())
        if times:
            return min(times)
        time.sleep(0.5)
    raise TimeoutError(f"no worker synced round {round_} within {timeout:g} s")


def _victim(status: dict[str, Any]) -> dict[str, Any]:
    worker: dict[str, Any] = next(w for w in status["workers"] if 0 not in w["ranks"])
    return worker


def _after_fault(cluster: Cluster, fault: Callable[[str], None], before: dict[str, Any]) -> float:
    victim = _victim(before)
    started = time.time()
    fault(victim["pod"])
    _until(
        cluster,
        "the next round without the victim",
        lambda s: (
            s.get("round", 0) > before["round"]
            and s.get("phase") == "Running"
            and all(w["pod"] != victim["pod"] for w in s.get("workers", []))
        ),
    )
    # The first round without the victim may be short-lived (a replacement joins): count
    # from the first sync of any later round the victim did not join.
    reformed = _first_sync_after(cluster, started, before["round"] + 1, without=victim["pod"])
    return reformed - started


def measure_job(cluster: Cluster) -> dict[str, float]:
    """Install the operator, run the job, and measure scale-out and two faults."""
    result: dict[str, float] = {}
    cluster.helm(
        "install", RELEASE, str(REPO_ROOT / "deploy" / "helm" / "elasticjob-operator"),
        "-n", SYSTEM_NS, "--create-namespace", "--wait", "--timeout", "300s",
        timeout=360,
    )  # fmt: skip
    try:
        cluster.kubectl("apply", "-f", "-", input=json.dumps(_job(2)))
        two = _until(
            cluster, "2 workers", lambda s: s.get("phase") == "Running" and s.get("worldSize") == 2
        )
        started = time.time()
        cluster.kubectl("scale", f"ej/{JOB}", "--replicas=4")
        four = _until(
            cluster, "4 workers", lambda s: s.get("worldSize") == 4 and s["round"] > two["round"]
        )
        result["scale_2_to_4_first_step_s"] = _first_sync_after(cluster, started, four["round"])
        result["scale_2_to_4_first_step_s"] -= started

        def partition(pod: str) -> None:
            cluster.faults.partition(pod, "default", mode="peers")

        def kill(pod: str) -> None:
            cluster.faults.kill(pod, "default")

        result["partition_from_peers_to_reformed_s"] = _after_fault(cluster, partition, four)
        now = _until(cluster, "3 or more workers", lambda s: s.get("worldSize", 0) >= 3)
        result["sigkill_to_survivors_next_step_s"] = _after_fault(cluster, kill, now)
    finally:
        cluster.kubectl("delete", "ej", JOB, "--wait=false", check=False)
        cluster.helm("uninstall", RELEASE, "-n", SYSTEM_NS, check=False, timeout=120)
    return result
