"""Worker pods as the driver's hosts: the driver (the same code ``elasticjob-run`` runs) stops
and kills workers through :class:`PodLauncher`, and the job's pod reconciler carries it out on
Kubernetes (it also pushes the usable pods to the driver as its hosts); the job's spec in the
driver's terms (its hosts are pods of ``slotsPerWorker`` processes)."""

from __future__ import annotations

from typing import Protocol

from elasticjob.driver.driver_types import DriverSettings, Recovery, WorkerLauncher, recovery
from elasticjob.operator.api import ElasticJobSpec
from elasticjob.wire.messages import SlotInfo, WorkerId


class PodActions(Protocol):
    """What the job's pod reconciler does to a worker's pod when the driver asks."""

    async def delete_pod(self, name: str, grace_s: int | None = None) -> None: ...

    def kill_pod(self, name: str, reason: str) -> None: ...


class PodLauncher(WorkerLauncher):
    """Pods start their worker processes themselves; stopping a worker deletes its pod, and
    killing one (it stopped answering) fails its pod, whose exit the driver hears at once."""

    def __init__(self, pods: PodActions) -> None:
        self._pods = pods

    async def start(self, worker: WorkerId, planned: SlotInfo) -> None:
        return None  # the pod plan created its pod; its process registers by itself

    async def stop(self, worker: WorkerId) -> None:
        await self._pods.delete_pod(worker.hostname)

    async def kill(self, worker: WorkerId, reason: str) -> None:
        self._pods.kill_pod(worker.hostname, reason)

    async def stop_all(self) -> None:
        return None  # the clean-pod policy decides, once the job has ended


def job_recovery(spec: ElasticJobSpec) -> Recovery:
    """How the job of ``spec`` recovers (see :func:`~elasticjob.driver.driver_types.recovery`)."""
    checkpoints = spec.checkpoint is not None
    return recovery(
        spec.mode,
        max_restarts=spec.max_restarts,
        checkpoints=checkpoints,
        max_failed_rounds_without_commit=spec.max_failed_rounds_without_commit,
    )


def driver_settings(spec: ElasticJobSpec) -> DriverSettings:
    """The driver's settings for ``spec``: its bounds in worker processes (pods times slots),
    its reset, restart and failed-rounds limits and timeouts (a heartbeat timeout of 0:
    silent workers are never killed), the durable fallback (:func:`job_recovery`) and the
    straggler policy."""
    slots = spec.slots_per_worker
    job = job_recovery(spec)
    return DriverSettings(
        min_np=spec.min_replicas * slots,
        max_np=spec.max_replicas * slots,
        reset_limit=spec.reset_limit,
        restart_limit=job.restart_limit,
        max_failed_rounds_without_commit=job.max_failed_rounds_without_commit,
        elastic_timeout_s=float(spec.elastic_timeout_seconds),
        start_timeout_s=float(spec.start_timeout_seconds),
        active_deadline_s=(
            None if spec.active_deadline_seconds is None else float(spec.active_deadline_seconds)
        ),
        heartbeat_timeout_s=float(spec.heartbeat_timeout_seconds) or None,
        checkpoint_fallback=job.checkpoint_fallback,
        stragglers=spec.stragglers.policy(),
    )
