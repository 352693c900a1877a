"""``python -m devcluster bench``: the numbers in docs/devcluster.md.

Measures, on a private cluster (own run directory and ports):

- ``up``: start to ready (readyz, Ready nodes, default ServiceAccount), binaries cached;
- pod create -> Running: time from the create request until a watch shows the
  pod Running, for pods created one after another (``sleep`` in a busybox image);
- agent CPU: the agent's CPU time over a window while 50 idle pods run, as a
  percentage of one core.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from devcluster.agent.kubeapi import Api
from devcluster.cluster import Cluster
from devcluster.config import ClusterConfig, read_token

logger = logging.getLogger(__name__)


def _cpu_seconds(pid: int) -> float:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"bench": "1"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "3600"]}],
        },
    }


async def _measure(
    cfg: ClusterConfig, agent_pid: int, samples: int, idle: int, window: float
) -> dict[str, float]:
    api = Api(cfg.server, read_token(cfg, "admin"), str(cfg.pki_dir / "ca.crt"))
    ns = "bench"
    await api.post("/api/v1/namespaces", {"metadata": {"name": ns}})
    sa = f"/api/v1/namespaces/{ns}/serviceaccounts"
    while not any(a.get("secrets") for a in (await api.get(sa)).get("items", [])):
        await asyncio.sleep(0.1)
    running: dict[str, asyncio.Future[float]] = {}
    listing = await api.get(f"/api/v1/namespaces/{ns}/pods")

    async def watch() -> None:
        path = f"/api/v1/namespaces/{ns}/pods"
        async for event in api.watch(path, listing["metadata"]["resourceVersion"]):
            obj = event["object"]
            fut = running.get(obj["metadata"]["name"])
            if fut and not fut.done() and obj.get("status", {}).get("phase") == "Running":
                fut.set_result(time.monotonic())

    watcher = asyncio.create_task(watch())
    loop = asyncio.get_running_loop()
    latencies = []
    try:
        for i in range(samples):
            name = f"lat-{i}"
            running[name] = loop.create_future()
            t0 = time.monotonic()
            await api.post(f"/api/v1/namespaces/{ns}/pods", _pod(name))
            latencies.append(await asyncio.wait_for(running[name], 30) - t0)
        for i in range(samples, idle):
            name = f"lat-{i}"
            running[name] = loop.create_future()
            await api.post(f"/api/v1/namespaces/{ns}/pods", _pod(name))
        await asyncio.wait_for(asyncio.gather(*running.values()), 120)
        await asyncio.sleep(5)
        before, t0 = _cpu_seconds(agent_pid), time.monotonic()
        await asyncio.sleep(window)
        cpu = (_cpu_seconds(agent_pid) - before) / (time.monotonic() - t0)
    finally:
        watcher.cancel()
        await api.close()
    return {
        "pod_create_to_running_median_s": statistics.median(latencies),
        "pod_create_to_running_max_s": max(latencies),
        "agent_cpu_percent_of_one_core": 100 * cpu,
        "idle_pods": float(idle),
    }


def run_bench(samples: int = 20, idle: int = 50, window: float = 30.0) -> dict[str, float]:
    """Start a private cluster, measure, stop it; return the numbers."""
    run_dir = Path(tempfile.mkdtemp(prefix="devcluster-bench-"))
    cfg = ClusterConfig.private(run_dir, 88, owner_pid=os.getpid())
    cluster = Cluster(cfg)
    t0 = time.monotonic()
    cluster.up()
    result = {"up_to_ready_s": time.monotonic() - t0}
    try:
        agent_pid = cluster.pid("agent")
        assert agent_pid is not None
        result.update(asyncio.run(_measure(cfg, agent_pid, samples, idle, window)))
    finally:
        cluster.down()
        shutil.rmtree(run_dir, ignore_errors=True)
    return result
