"""Each job's record (``elasticjob/driver/job_record.py``) kept in the cluster: a ConfigMap
``<job>-record`` owned by the job (garbage-collected with it), rewritten when the one record
saving policy says (``elasticjob/driver/record_saving.py``: the journal pushes each change),
and at once when the job ends. An operator that restarts carries on the stored record, so the
timeline spans the whole job (less the samples since the last save)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Final

import kubernetes
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from elasticjob.driver.driver import ElasticDriver
from elasticjob.driver.job_record import EventKind, JobRecord, JobRecordData
from elasticjob.driver.job_state import JobState
from elasticjob.driver.record_saving import RecordSaver
from elasticjob.operator import pods as podlib
from elasticjob.operator.kube import KubeApi
from elasticjob.operator.kube_errors import ApiOutcome, api_outcome
from elasticjob.operator.kube_transport import load_config

logger = logging.getLogger(__name__)

RECORD_KEY: Final = "record.json"


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


class ConfigMapStore:
    """A job's record in its ConfigMap (a ``record_saving.RecordStore``)."""

    def __init__(self, api: KubeApi, namespace: str, job: Mapping[str, Any]) -> None:
        self._api = api
        self._namespace = namespace
        self._job = job

    async def save(self, data: JobRecordData) -> None:
        await self._api.apply_config_map(self._namespace, record_config_map(self._job, data))


class RecordKeeper:
    """Keeps one job's record in the cluster (see the module docstring)."""

    def __init__(
        self, api: KubeApi, namespace: str, job_id: str, clock: Callable[[], float]
    ) -> None:
        self._api = api
        self._namespace = namespace
        self._job_id = job_id
        self._clock = clock
        self._replicas: int | None = None
        self.saver: RecordSaver | None = None
        """Saves the record once :meth:`attach` gave it to a driver."""

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

    async def suspended_without_a_run(
        self,
        job: Mapping[str, Any],
        stored: JobRecordData | None,
        message: str,
        wall_clock: Callable[[], float],
    ) -> None:
        """The job is suspended with no run to save (created suspended, or suspended while no
        operator ran it): its record (``stored`` carried on, or a new one) says so, from now
        (raises ``ApiException`` when it could not be saved)."""
        if stored is None:
            record, state, goodput = JobRecord(self._job_id, wall_clock), JobState(), 1.0
        else:
            record = JobRecord.resumed(stored, wall_clock)
            state, goodput = stored.state, stored.goodput
        record.event(EventKind.SUSPENDED, message)
        suspended = state.model_copy(update={"suspended_since": wall_clock()})
        await ConfigMapStore(self._api, self._namespace, job).save(record.data(suspended, goodput))

    def attach(
        self,
        job: Mapping[str, Any],
        driver: ElasticDriver,
        stored: JobRecordData | None,
        wall_clock: Callable[[], float],
    ) -> RecordSaver:
        """Give ``driver`` the job's record (``stored`` carried on, or a new one) and return
        what saves it (its :meth:`RecordSaver.run` saves as it changes)."""
        if stored is not None:
            driver.resume_record(stored, wall_clock)
        else:
            driver.start_record(self._job_id, wall_clock, f"job {self._job_id} created")
        self.saver = RecordSaver(
            driver.journal,
            ConfigMapStore(self._api, self._namespace, job),
            self._clock,
            driver.job_state,
            errors=(ApiException,),
        )
        return self.saver

    def note_replicas(self, driver: ElasticDriver, replicas: int) -> None:
        """Record a scale request when ``spec.replicas`` changed."""
        if self._replicas is not None and replicas != self._replicas:
            driver.scaled(self._replicas, replicas)
        self._replicas = replicas


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
