"""``python -m devcluster bench --runtime containerd``: the real-node numbers of docs/devcluster.md.

On a private real-node cluster (own run directory, ports and ``net``):

- ``up`` to ready, cold (a new run directory: every image imported into every node) and warm
  (``down`` then ``up`` again in the same run directory: the images are already there), with
  the steps of each (``timings.json``: images, network, control plane, containerd, import,
  nodes Ready);
- image build, cold and warm, as :func:`devcluster.imagebuild.ensure_images` reports it
  (cold only when the cache was empty before this run);
- pod create -> Running, pods created one after another on the Debian base image (median,
  p99); and the first pod of the worker image on a node (which unpacks the image there);
- the operator's figures (:mod:`devcluster.jobbench`): ``kubectl scale`` 2 -> 4 -> first step
  at 4, a worker partitioned from its peers -> the job re-formed, SIGKILL of a worker ->
  the survivors' next step.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from devcluster.cluster import Cluster
from devcluster.config import ClusterConfig
from devcluster.imagebuild import BASE_IMAGE, ensure_images, worker_image
from devcluster.jobbench import measure_job
from devcluster.realcluster import timings_path

BENCH_NET = 211


def _pod(name: str, image: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{"name": "c", "image": image, "command": ["sleep", "3600"]}],
        },
    }


def _create_and_wait_running(cluster: Cluster, pod: dict[str, Any], timeout: float) -> float:
    """Seconds from ``kubectl create`` until the pod is Running."""
    started = time.monotonic()
    cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
    name = pod["metadata"]["name"]
    cluster.kubectl(
        "wait", "--for=jsonpath={.status.phase}=Running", f"pod/{name}", f"--timeout={timeout}s"
    )
    return time.monotonic() - started


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def run_real_bench(samples: int = 20) -> dict[str, float]:
    """Start a private real-node cluster twice, measure, stop it; return the numbers."""
    result: dict[str, float] = {}
    started = time.monotonic()
    images = ensure_images(Path(ClusterConfig().cache_dir))
    built = [i.build_seconds for i in images if i.build_seconds is not None]
    if built:
        result["image_build_cold_s"] = time.monotonic() - started
    started = time.monotonic()
    ensure_images(Path(ClusterConfig().cache_dir))
    result["image_build_warm_s"] = time.monotonic() - started

    run_dir = Path(tempfile.mkdtemp(prefix="devcluster-real-bench-"))
    cfg = ClusterConfig.private(run_dir, BENCH_NET, runtime="containerd", owner_pid=os.getpid())
    cluster = Cluster(cfg)
    try:
        for label in ("cold", "warm"):
            t0 = time.monotonic()
            cluster.up(timeout=600)
            result[f"up_to_ready_{label}_s"] = time.monotonic() - t0
            steps = json.loads(timings_path(cfg).read_text())
            for step, seconds in steps.items():
                result[f"up_{label}_{step}"] = seconds
            if label == "cold":
                cluster.down()
        nodes = cfg.node_names()
        latencies = [
            _create_and_wait_running(
                cluster, _pod(f"lat-{i}", BASE_IMAGE, nodes[i % len(nodes)]), 120
            )
            for i in range(samples)
        ]
        result["pod_create_to_running_median_s"] = statistics.median(latencies)
        result["pod_create_to_running_p99_s"] = _percentile(latencies, 0.99)
        result["worker_image_first_pod_s"] = _create_and_wait_running(
            cluster, _pod("worker-first", worker_image(), nodes[0]), 300
        )
        result["worker_image_second_pod_s"] = _create_and_wait_running(
            cluster, _pod("worker-second", worker_image(), nodes[0]), 300
        )
        cluster.kubectl("delete", "pods", "--all", "--wait=false")
        result.update(measure_job(cluster))
    finally:
        cluster.down()
        shutil.rmtree(run_dir, ignore_errors=True)
    return result
