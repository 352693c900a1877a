"""One controller task per ElasticJob: started when the operator first sees the job while it
leads (or when it comes to lead), stopped when the job is deleted, or when the operator stops or
stands down (it is no longer the leader: ``leader_election.py``).

The operator runs its job controllers itself rather than as kopf daemons: a kopf daemon makes
kopf put its finalizer on every ElasticJob, and once the operator is uninstalled nothing removes
it, so the jobs could no longer be deleted. Nothing here needs a finalizer: a job's pods and
Secret are owned by the job and garbage-collected with it.

Like a kopf daemon, a job's task is started once per object (by uid), restarted after a backoff
when it raises, never restarted once it returned (the job ended), and on deletion told to stop
(``stopped``) and cancelled if it does not within the cancellation timeout.

A replica that does not lead keeps every job's latest body (kopf's watch goes on) and runs no
task: a standby never acts on a job. When it comes to lead it starts the tasks of the jobs that
have not ended; when it stands down it stops them with ``stopped.handover`` set: the job goes on
under another operator, so its controller lets the job's workers go to it rather than ending
anything.

A finished job with ``spec.ttlSecondsAfterFinished`` is deleted when its time is up, by the
leader alone (``finished_jobs.py``).
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from elasticjob.event_waits import wait_event
from elasticjob.operator.finished_jobs import FinishedJobs, ended

logger = logging.getLogger(__name__)


class StopSignal(asyncio.Event):
    """Set when a job's controller must stop: the job was deleted, or (``handover``) the job
    goes on under another operator (this one stops or stands down)."""

    def __init__(self) -> None:
        super().__init__()
        self.handover = False


RunJob = Callable[[str, str, Mapping[str, Any], StopSignal], Awaitable[None]]
"""Runs one job: ``(namespace, name, body, stopped)``. ``body`` is kept up to date with the
job's latest version; ``stopped`` is set when the job is deleted or the operator stops."""

JobUpdated = Callable[[str, str], None]
"""Told ``(namespace, name)`` of a running job whose body was just updated (a scale, a spec
change) or that was just told to stop, so that its controller acts on it at once."""


class Stopped(Protocol):
    """Set when the job is deleted or the operator stops (a :class:`StopSignal`)."""

    handover: bool

    def is_set(self) -> bool: ...


@dataclass
class _Job:
    body: dict[str, Any]
    stopped: StopSignal = field(default_factory=StopSignal)
    task: asyncio.Task[None] | None = None
    ended: bool = False
    """Its controller returned on its own: the job ended under this operator."""

    def runnable(self) -> bool:
        """Whether a leader runs a task for it: not running, not ended."""
        return self.task is None and not self.ended and not ended(self.body)


class JobSupervisor:
    """Runs :data:`RunJob` once per ElasticJob the operator sees (see the module docstring)."""

    def __init__(
        self,
        run_job: RunJob,
        *,
        updated: JobUpdated | None = None,
        backoff_s: float = 5.0,
        cancellation_timeout_s: float = 10.0,
        leading: bool = True,
        finished: FinishedJobs | None = None,
    ) -> None:
        """``finished``: deletes finished jobs whose ttl is up (None: they stay)."""
        self._run_job = run_job
        self._finished = finished
        self._updated = updated
        self._backoff_s = backoff_s
        self._cancellation_timeout_s = cancellation_timeout_s
        self._jobs: dict[str, _Job] = {}
        self.leading = leading
        """Whether jobs' tasks run (this operator leads; False: it stands by until
        :meth:`lead`)."""

    async def observe(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        """Take in one watch event of an ElasticJob (``event_type`` None: it was listed)."""
        metadata = body["metadata"]
        uid = str(metadata["uid"])
        job = self._jobs.get(uid)
        if event_type == "DELETED" or metadata.get("deletionTimestamp"):
            if self._finished is not None:
                self._finished.forget(uid)
            if job is not None:
                await self._stop(job)
                del self._jobs[uid]
            return
        if self.leading and self._finished is not None:
            self._finished.observe(body)
        if job is not None:
            job.body.clear()
            job.body.update(copy.deepcopy(dict(body)))
            if self._updated is not None:
                self._updated(str(metadata["namespace"]), str(metadata["name"]))
            return
        job = _Job(copy.deepcopy(dict(body)))
        self._jobs[uid] = job
        if self.leading and job.runnable():
            self._start(job)

    def unended(self) -> list[tuple[str, str]]:
        """The (namespace, name) of the jobs seen that have not ended."""
        return [
            (str(job.body["metadata"]["namespace"]), str(job.body["metadata"]["name"]))
            for job in self._jobs.values()
            if not job.ended and not ended(job.body)
        ]

    def lead(self) -> None:
        """Run every job that has not ended, and each new one from now on."""
        self.leading = True
        for job in self._jobs.values():
            if self._finished is not None:
                self._finished.observe(job.body)
            if job.runnable():
                self._start(job)

    async def stand_down(self, *, at_once: bool = False, grace_s: float | None = None) -> None:
        """Stop every job's task (``stopped.handover``: the jobs go on under another operator)
        and start none until :meth:`lead`. A task that has not stopped within ``grace_s``
        (None: the cancellation timeout) is cancelled; ``at_once``: without waiting (this
        operator lost its lease: another may act already)."""
        self.leading = False
        if self._finished is not None:
            await self._finished.stop()
        grace = 0.0 if at_once else grace_s
        await asyncio.gather(
            *(self._stop(job, handover=True, grace_s=grace) for job in self._jobs.values())
        )

    async def stop_all(self) -> None:
        """Stop every job's task (the operator stops); the jobs themselves go on."""
        await self.stand_down()
        self._jobs.clear()

    def _start(self, job: _Job) -> None:
        metadata = job.body["metadata"]
        namespace, name = str(metadata["namespace"]), str(metadata["name"])
        job.stopped = StopSignal()
        job.task = asyncio.create_task(
            self._supervise(namespace, name, job), name=f"job {namespace}/{name}"
        )

    async def _supervise(self, namespace: str, name: str, job: _Job) -> None:
        while True:
            try:
                await self._run_job(namespace, name, job.body, job.stopped)
                job.ended = not job.stopped.is_set()
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

    async def _stop(
        self, job: _Job, *, handover: bool = False, grace_s: float | None = None
    ) -> None:
        """Stop the job's task: told, then cancelled after ``grace_s`` (None: the cancellation
        timeout). The task is forgotten only once it has ended: a stop cut short leaves it to
        the next stop."""
        job.stopped.handover = handover
        job.stopped.set()
        task = job.task
        if task is not None and not task.done():
            if self._updated is not None:
                metadata = job.body["metadata"]
                self._updated(str(metadata["namespace"]), str(metadata["name"]))
            timeout = self._cancellation_timeout_s if grace_s is None else grace_s
            _, pending = await asyncio.wait({task}, timeout=timeout)
            if pending:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if job.task is task:
            job.task = None
