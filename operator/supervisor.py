"""One controller task per ElasticJob: started when the operator first sees the job, stopped
when the job is deleted or the operator stops.

The operator runs its job controllers itself rather than as kopf daemons: a kopf daemon makes
kopf put its finalizer on every ElasticJob, and once the operator is uninstalled nothing removes
it, so the jobs could no longer be deleted. Nothing here needs a finalizer: a job's pods and
token Secret are owned by the job and garbage-collected with it.

Like a kopf daemon, a job's task is started once per object (by uid), restarted after a backoff
when it raises, never restarted once it returned (the job ended), and on deletion told to stop
(``stopped``) and cancelled if it does not within the cancellation timeout.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from elasticjob.event_waits import wait_event
from elasticjob.operator.api import Phase

logger = logging.getLogger(__name__)

RunJob = Callable[[str, str, Mapping[str, Any], asyncio.Event], Awaitable[None]]
"""Runs one job: ``(namespace, name, body, stopped)``. ``body`` is kept up to date with the
job's latest version; ``stopped`` is set when the job is deleted or the operator stops."""

JobUpdated = Callable[[str, str], None]
"""Told ``(namespace, name)`` of a running job whose body was just updated (a scale, a spec
change), so that its controller acts on it at once."""


class Stopped(Protocol):
    """Set when the job is deleted or the operator stops (an :class:`asyncio.Event`)."""

    def is_set(self) -> bool: ...


ENDED_PHASES = frozenset({Phase.SUCCEEDED.value, Phase.FAILED.value})


@dataclass
class _Job:
    body: dict[str, Any]
    stopped: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


class JobSupervisor:
    """Runs :data:`RunJob` once per ElasticJob the operator sees (see the module docstring)."""

    def __init__(
        self,
        run_job: RunJob,
        *,
        updated: JobUpdated | None = None,
        backoff_s: float = 5.0,
        cancellation_timeout_s: float = 10.0,
    ) -> None:
        self._run_job = run_job
        self._updated = updated
        self._backoff_s = backoff_s
        self._cancellation_timeout_s = cancellation_timeout_s
        self._jobs: dict[str, _Job] = {}

    async def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """Take in one watch event of an ElasticJob (``event_type`` None: it was listed)."""
        metadata = body["metadata"]
        uid = str(metadata["uid"])
        job = self._jobs.get(uid)
        if event_type == "DELETED" or metadata.get("deletionTimestamp"):
            if job is not None:
                await self._stop(job)
                del self._jobs[uid]
            return
        if job is not None:
            job.body.clear()
            job.body.update(copy.deepcopy(dict(body)))
            if self._updated is not None:
                self._updated(str(metadata["namespace"]), str(metadata["name"]))
            return
        job = _Job(copy.deepcopy(dict(body)))
        self._jobs[uid] = job
        if (body.get("status") or {}).get("phase") in ENDED_PHASES:
            return  # ended before this operator saw it: nothing to run
        namespace, name = str(metadata["namespace"]), str(metadata["name"])
        job.task = asyncio.create_task(
            self._supervise(namespace, name, job), name=f"job {namespace}/{name}"
        )

    async def stop_all(self) -> None:
        """Stop every job's task (the operator stops); the jobs themselves go on."""
        jobs = list(self._jobs.values())
        self._jobs.clear()
        await asyncio.gather(*(self._stop(job) for job in jobs))

    async def _supervise(self, namespace: str, name: str, job: _Job) -> None:
        while True:
            try:
                await self._run_job(namespace, name, job.body, job.stopped)
                return
            except Exception:
                if job.stopped.is_set():
                    logger.info("job %s/%s stopped with an error", namespace, name, exc_info=True)
                    return
                logger.exception(
                    "job %s/%s: the controller failed; restarting in %.0f s",
                    namespace,
                    name,
                    self._backoff_s,
                )
            await wait_event(job.stopped, self._backoff_s)
            if job.stopped.is_set():
                return

    async def _stop(self, job: _Job) -> None:
        job.stopped.set()
        task = job.task
        if task is None or task.done():
            return
        _, pending = await asyncio.wait({task}, timeout=self._cancellation_timeout_s)
        if pending:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
