"""How soon a job's driver knows of a worker pod that became Running (prints its figures;
asserts nothing).

A job's controller, its pod reconciler, its driver and rendezvous run as in the operator, on
an in-memory Kubernetes API (``tests/support/fake_kube.py``); the benchmark plays the
kubelets. For each of ``--pods`` pods it waits a random moment, marks the pod Running (the
watch event reaches the controller at once), and measures until the driver's hosts hold it.

Two ways in the same process, alternated: ``pushed``, the code as it is (the reconciler
pushes the usable pods to the driver when they change), and ``polled``, the design it
replaced (the driver's discovery read the reconciler's hosts every second). The figure the
redesign aims at: pushed under 50 ms.

Usage: python bench/host_push.py [--pods 40] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from elasticjob.driver.discovery import HostDiscovery, poll_hosts
from elasticjob.operator.controller import JobController
from elasticjob.operator.controller_settings import ControllerSettings
from elasticjob.operator.kube import KubeApi
from elasticjob.operator.pod_reconciler import PodReconciler
from elasticjob.rendezvous.server import RendezvousService
from tests.support.fake_kube import FakeKube

POLL_INTERVAL_S = 1.0
"""The driver's discovery interval before the redesign."""


class PolledHosts(HostDiscovery):
    """The design the redesign replaced: the reconciler leaves the usable pods where the
    driver's discovery reads them, every :data:`POLL_INTERVAL_S`."""

    blocks = False

    def __init__(self) -> None:
        self.hosts: dict[str, int] = {}

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        return dict(self.hosts)


def polled(reconciler: PodReconciler, discovery: PolledHosts) -> None:
    """Make ``reconciler`` leave its hosts in ``discovery`` instead of pushing them."""

    def leave_hosts(pods: Iterable[str]) -> None:
        discovery.hosts = dict.fromkeys(pods, reconciler.slots)

    reconciler._push_hosts = leave_hosts  # type: ignore[method-assign]


async def measure(mode: str, pods: int, rng: random.Random) -> list[float]:
    """Seconds from each pod's Running event to the driver knowing it as a host."""
    kube = FakeKube()
    body = kube.job_body(
        "bench",
        {
            "replicas": pods,
            "minReplicas": 1,
            "maxReplicas": pods,
            "template": {"spec": {"containers": [{"name": "worker", "image": "img"}]}},
        },
    )
    controller = JobController(
        "ns",
        "bench",
        cast(KubeApi, kube),
        RendezvousService(),
        ControllerSettings("http://rendezvous:8470", reconcile_interval_s=1.0),
        set(),
    )
    kube.watch_pods(controller.on_pod_event)
    discovery = PolledHosts()
    if mode == "polled":
        polled(controller.pods, discovery)
    task = asyncio.create_task(controller.run(body, asyncio.Event()))
    await kube.wait_for(lambda: len(kube.pods) == pods and controller.driver is not None)
    driver = controller.driver
    assert driver is not None
    known: dict[str, float] = {}
    arrived = asyncio.Event()
    update = driver.update_hosts

    def timed_update(hosts: Mapping[str, int]) -> None:
        now = time.perf_counter()
        for host in hosts:
            known.setdefault(host, now)
        arrived.set()
        update(hosts)

    driver.update_hosts = timed_update  # type: ignore[method-assign]
    poller = asyncio.create_task(poll_hosts(discovery, driver, POLL_INTERVAL_S))
    latencies = []
    try:
        for index, name in enumerate(sorted(kube.pods)):
            await asyncio.sleep(rng.uniform(0.0, POLL_INTERVAL_S))
            started = time.perf_counter()
            kube.run_pod(name, f"node-{index}")
            while name not in known:
                arrived.clear()
                await asyncio.wait_for(arrived.wait(), 10 * POLL_INTERVAL_S)
            latencies.append(known[name] - started)
    finally:
        for each in (poller, task):
            each.cancel()
        await asyncio.gather(poller, task, return_exceptions=True)
    return latencies


def summary(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    return {
        "median_ms": 1000 * statistics.median(ordered),
        "p90_ms": 1000 * ordered[int(0.9 * (len(ordered) - 1))],
        "max_ms": 1000 * ordered[-1],
    }


async def main(arguments: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(arguments)
    rng = random.Random(args.seed)
    results: dict[str, list[float]] = {"pushed": [], "polled": []}
    for _ in range(args.rounds):
        for mode in results:
            results[mode] += await measure(mode, args.pods, rng)
    figures: dict[str, Any] = {mode: summary(found) for mode, found in results.items()}
    print(f"pods Running -> the driver knows them as hosts, {args.pods} pods x {args.rounds}")
    for mode, figure in figures.items():
        print(
            f"  {mode:>6}: median {figure['median_ms']:8.2f} ms, p90 {figure['p90_ms']:8.2f} ms, "
            f"max {figure['max_ms']:8.2f} ms"
        )
    ratio = figures["pushed"]["median_ms"] / figures["polled"]["median_ms"]
    print(f"  pushed / polled (median): {ratio:.4f}; goal: pushed under 50 ms")


if __name__ == "__main__":
    asyncio.run(main())
