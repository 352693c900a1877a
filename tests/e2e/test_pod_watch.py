"""The job controller against a real API server when its pod watch misses events: it runs in
this process (no helm-installed operator; the ElasticJob CRD is applied alone) and hears its
pods through a watch that drops every event in which a pod is Running, as a lost event would.
Its re-lists must still show it the running pods, so the driver forms the job's first round
(before, its pod map kept the Pending copies and the job waited for hosts for ever)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from devcluster.cluster import Cluster
from elasticjob.operator.api import worker_selector
from elasticjob.operator.controller import JobController
from elasticjob.operator.controller_settings import ControllerSettings
from elasticjob.operator.kube import KubeApi
from elasticjob.operator.supervisor import StopSignal
from elasticjob.rendezvous.server import RendezvousService
from tests.support.elastic_jobs import job_manifest
from tests.support.job_runs import JobRun, kill_leftovers, read_events
from tests.support.kube import Kube
from tests.support.operator_release import CHART, delete_webhook, running_operator_pods

CRD = CHART / "crds" / "elasticjob.dev_elasticjobs.yaml"
ROUND_TIMEOUT_S = 180.0  # cold imports of torch in the worker pods on a loaded machine
END_TIMEOUT_S = 120.0


class LossyPodWatch:
    """Watches a job's pods and hands each event to ``deliver`` on ``loop``, except those in
    which the pod is Running (counted in ``dropped``)."""

    def __init__(
        self,
        namespace: str,
        job: str,
        deliver: Callable[[str, Mapping[str, Any]], None],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.dropped = 0
        self._namespace, self._selector = namespace, worker_selector(job)
        self._deliver, self._loop = deliver, loop
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lossy pod watch", daemon=True)

    def __enter__(self) -> LossyPodWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        assert not self._thread.is_alive(), "the watch thread did not stop"

    def _run(self) -> None:
        core = kubernetes.client.CoreV1Api()
        while not self._stop.is_set():  # each stream ends after 2 s: the stop flag is seen
            stream = kubernetes.watch.Watch().stream(
                core.list_namespaced_pod,
                self._namespace,
                label_selector=self._selector,
                timeout_seconds=2,
            )
            for event in stream:
                pod: dict[str, Any] = event["raw_object"]
                if (pod.get("status") or {}).get("phase") == "Running":
                    self.dropped += 1
                else:
                    self._loop.call_soon_threadsafe(self._deliver, event["type"], pod)


@pytest.fixture
async def service(cluster: Cluster) -> AsyncIterator[RendezvousService]:
    """A rendezvous service in this process, on the address where this machine meets the
    cluster's pods (loopback for process nodes, the node network's bridge for real ones)."""
    rendezvous = RendezvousService()
    await rendezvous.start(cluster.config.api_host)
    try:
        yield rendezvous
    finally:
        await rendezvous.stop()


async def wait_for(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s: {what}"
        await asyncio.sleep(0.2)


async def test_the_first_round_forms_though_the_watch_misses_the_running_pods(
    no_operator: Cluster, kube: Kube, service: RendezvousService, tmp_path: Path
) -> None:
    # A helm-installed operator would run the job too: none runs (``no_operator``).
    cluster = no_operator
    assert not running_operator_pods(cluster)
    delete_webhook(cluster)
    cluster.kubectl("apply", "-f", str(CRD))
    cluster.kubectl("wait", "--for=condition=Established", "crd/elasticjobs.elasticjob.dev")
    kubernetes.config.load_kube_config(config_file=str(cluster.config.kubeconfig))
    log_dir, stop_file = tmp_path / "events", tmp_path / "stop"
    kube.apply(job_manifest("lossy", log_dir, stop_file, replicas=2, minReplicas=2))
    body = kube.get("ej", "lossy")
    assert body is not None
    controller = JobController(
        kube.ns, "lossy", KubeApi(), service, ControllerSettings(service.url), set()
    )
    stopped = StopSignal()
    with LossyPodWatch(kube.ns, "lossy", controller.on_pod_event, asyncio.get_running_loop()) as w:
        task = asyncio.create_task(controller.run(body, stopped))
        try:
            await wait_for(
                "the first round with both workers",
                lambda: (
                    task.done()
                    or (controller.driver is not None and len(controller.driver.slots) == 2)
                ),
                ROUND_TIMEOUT_S,
            )
            assert not task.done(), f"the controller ended: {task}"
            assert w.dropped > 0, "the watch dropped no event: the test tests nothing"
            stop_file.touch()
            await asyncio.wait_for(asyncio.shield(task), END_TIMEOUT_S)
            assert controller.driver is not None and controller.driver.result is not None
            assert controller.driver.result.success, controller.driver.result
        finally:
            stopped.set()
            await asyncio.wait_for(task, 30)
            kill_leftovers(JobRun(0, "", "", read_events(log_dir)))
