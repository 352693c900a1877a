"""Each job's record (``elasticjob/driver/job_record.py``) kept in the cluster: a ConfigMap
``<job>-record`` owned by the job (garbage-collected with it), rewritten when it changed: at
most every :data:`SAVE_INTERVAL_S` for a new event, every :data:`SAMPLES_SAVE_INTERVAL_S` for
progress samples alone, and at once when the job ends (:func:`save_due`). An operator that
restarts carries on the stored record, so the timeline spans the whole job (less the samples
since the last save)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Final

import kubernetes
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from elasticjob.driver.driver import ElasticDriver
from elasticjob.driver.job_record import EventKind, JobRecord, JobRecordData, RecordChange
from elasticjob.operator import pods as podlib
from elasticjob.operator.kube import KubeApi
from elasticjob.operator.kube_errors import ApiOutcome, api_outcome
from elasticjob.operator.kube_transport import load_config

logger = logging.getLogger(__name__)

SAVE_INTERVAL_S: Final = 10.0
"""Least time between two saves of a record that has a new event."""
SAMPLES_SAVE_INTERVAL_S: Final = 60.0
"""Least time between two saves of a record that has new progress samples alone: a running
job samples its progress every second, its record grows to a few hundred kB, and at 200 jobs
a save every 10 s each was 20 ConfigMap writes a second for the API server and etcd."""
RECORD_KEY: Final = "record.json"


def save_due(changed: RecordChange, since_saved: float | None, *, now: bool) -> bool:
    """Whether to save a record with ``changed`` (:class:`RecordChange`), last saved
    ``since_saved`` seconds ago (None: not yet by this operator): never when nothing changed;
    with ``now`` (the job ends) at once; else once the interval of the change's kind has
    passed (a clock stepped back saves)."""
    if changed is RecordChange.NONE:
        return False
    if now or since_saved is None:
        return True
    interval = SAVE_INTERVAL_S if changed is RecordChange.EVENTS else SAMPLES_SAVE_INTERVAL_S
    return not 0 <= since_saved < interval


def record_name(job_name: str) -> str:
    """The name of the ConfigMap that keeps the job's record."""
    return f"{job_name}-record"


def record_config_map(job: Mapping[str, Any], data: JobRecordData) -> dict[str, Any]:
    """The ConfigMap holding ``data`` for ``job``."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": podlib.owned_metadata(job, record_name(job["metadata"]["name"])),
        "data": {RECORD_KEY: data.model_dump_json()},
    }


def parse_record(config_map: Mapping[str, Any]) -> JobRecordData:
    """The record a ConfigMap holds (:class:`LookupError` when it holds none)."""
    text = (config_map.get("data") or {}).get(RECORD_KEY)
    if text is None:
        raise LookupError(f"the ConfigMap has no key {RECORD_KEY!r}")
    return JobRecordData.model_validate_json(text)


class RecordKeeper:
    """Keeps one job's record in the cluster (see the module docstring)."""

    def __init__(
        self, api: KubeApi, namespace: str, job_id: str, clock: Callable[[], float]
    ) -> None:
        self._api = api
        self._namespace = namespace
        self._job_id = job_id
        self._clock = clock
        self._saved_at: float | None = None
        self._replicas: int | None = None

    async def load(self, job: Mapping[str, Any]) -> JobRecordData | None:
        """The job's stored record (None: there is none, or it is unreadable)."""
        name = record_name(job["metadata"]["name"])
        stored = await self._api.read_config_map(self._namespace, name)
        if stored is None:
            return None
        try:
            return parse_record(stored)
        except (LookupError, ValidationError) as exc:
            logger.warning(
                "job %s: the stored record is unreadable, a new one starts: %s", self._job_id, exc
            )
            return None

    def attach(
        self,
        driver: ElasticDriver,
        stored: JobRecordData | None,
        wall_clock: Callable[[], float],
    ) -> None:
        """Give ``driver`` the job's record: ``stored`` carried on, or a new one."""
        if stored is not None:
            driver.journal.record = JobRecord.resumed(stored, wall_clock)
            return
        driver.journal.record = JobRecord(self._job_id, wall_clock)
        driver.journal.record.event(EventKind.STARTED, f"job {self._job_id} created")

    def note_replicas(self, driver: ElasticDriver, replicas: int) -> None:
        """Record a scale request when ``spec.replicas`` changed."""
        if self._replicas is not None and replicas != self._replicas:
            driver.journal.record.event(
                EventKind.SCALE,
                f"replicas {self._replicas} -> {replicas}",
                round=driver.round,
                world_size=len(driver.slots),
            )
        self._replicas = replicas

    async def save(
        self, job: Mapping[str, Any], driver: ElasticDriver, *, now: bool = False
    ) -> None:
        """Write the record when :func:`save_due` (``now``: the job ends). A failed write is
        logged and tried again later."""
        since = None if self._saved_at is None else self._clock() - self._saved_at
        if not save_due(driver.journal.record.changed, since, now=now):
            return
        data = driver.journal.record_data()
        try:
            await self._api.apply_config_map(self._namespace, record_config_map(job, data))
            driver.journal.record.saved()
        except ApiException as exc:
            logger.warning(
                "job %s: could not store its record: %s %s", self._job_id, exc.status, exc.reason
            )
        self._saved_at = self._clock()


def read_from_cluster(job_name: str, namespace: str | None) -> JobRecordData:
    """The stored record of the ElasticJob ``job_name`` (the kubeconfig's namespace by default;
    :class:`LookupError` when there is none)."""
    load_config()
    if namespace is None:
        try:
            _, context = kubernetes.config.list_kube_config_contexts()  # type: ignore[no-untyped-call]
        except kubernetes.config.ConfigException:
            context = None
        namespace = (context or {}).get("context", {}).get("namespace") or "default"
    core = kubernetes.client.CoreV1Api()
    try:
        found = core.read_namespaced_config_map(record_name(job_name), namespace)
    except ApiException as exc:
        if api_outcome(exc) is ApiOutcome.NOT_FOUND:
            raise LookupError(f"no record of ElasticJob {namespace}/{job_name}") from exc
        raise LookupError(f"reading the record of {namespace}/{job_name}: {exc.reason}") from exc
    return parse_record({"data": found.data})
