"""Worker pods as the driver's hosts: the driver (the same code ``elasticjob-run`` runs)
discovers hosts and stops workers through these, and the controller carries both out on
Kubernetes; the job's spec in the driver's terms (its hosts are pods of ``slotsPerWorker``
processes)."""

from __future__ import annotations

from typing import Protocol

from elasticjob.driver.api import DriverSettings, HostDiscovery, WorkerLauncher
from elasticjob.operator.api import ElasticJobSpec
from elasticjob.wire.messages import WorkerId


class PodDiscovery(HostDiscovery):
    """The hosts of the controller's latest pod plan (``PodPlan.hosts``)."""

    blocks = False

    def __init__(self) -> None:
        self.hosts: dict[str, int] = {}

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        return dict(self.hosts)


class PodActions(Protocol):
    """What the controller does to a worker's pod when the driver asks."""

    async def delete_pod(self, name: str, grace_s: int | None = None) -> None: ...

    def evict(self, name: str, reason: str) -> None: ...


class PodLauncher(WorkerLauncher):
    """Pods start their worker processes themselves; stopping a worker deletes its pod, and
    killing one (it stopped answering) fails its pod."""

    def __init__(self, pods: PodActions) -> None:
        self._pods = pods

    async def start(self, worker: WorkerId) -> None:
        return None  # the pod plan created its pod; its process registers by itself

    async def stop(self, worker: WorkerId) -> None:
        await self._pods.delete_pod(worker.hostname)

    async def kill(self, worker: WorkerId, reason: str) -> None:
        self._pods.evict(worker.hostname, reason)

    async def stop_all(self) -> None:
        return None  # the clean-pod policy decides, once the job has ended


def driver_settings(spec: ElasticJobSpec) -> DriverSettings:
    """The driver's settings for ``spec``: its bounds in worker processes (pods times slots),
    its reset limit and timeouts (a heartbeat timeout of 0 turns eviction off), and the
    durable fallback when the spec has a checkpoint policy."""
    slots = spec.slots_per_worker
    return DriverSettings(
        min_np=spec.min_replicas * slots,
        max_np=spec.max_replicas * slots,
        reset_limit=spec.reset_limit,
        elastic_timeout_s=float(spec.elastic_timeout_seconds),
        heartbeat_timeout_s=float(spec.heartbeat_timeout_seconds) or None,
        checkpoint_fallback=spec.checkpoint is not None,
    )
