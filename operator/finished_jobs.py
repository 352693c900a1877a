"""When a finished ElasticJob is deleted: ``spec.ttlSecondsAfterFinished`` after it Succeeded or
Failed (as the TTL-after-finished controller does for batch/v1 Jobs).

:func:`deletion_due` decides, from the job's body alone; :class:`FinishedJobs` keeps one timer per
finished job while this operator leads and deletes the job when its timer ends. The body is the
whole input: the status's ``completionTime`` outlives operator restarts, so a new leader finds
how long each job has left, and a ttl changed after the job finished moves its timer.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from elasticjob.operator.api import Phase

logger = logging.getLogger(__name__)

ENDED_PHASES = frozenset({Phase.SUCCEEDED.value, Phase.FAILED.value})
"""The phases of a job that has finished (a suspended job has not)."""

DeleteJob = Callable[[str, str, str], Awaitable[None]]
"""Deletes the job ``(namespace, name, uid)``: only that object, not one made again since."""


def ended(body: Mapping[str, Any]) -> bool:
    """Whether the job's status says it finished (Succeeded or Failed)."""
    return (body.get("status") or {}).get("phase") in ENDED_PHASES


def deletion_due(body: Mapping[str, Any]) -> float | None:
    """When the job is to be deleted (wall time, seconds since the epoch): its completion time
    plus ``spec.ttlSecondsAfterFinished``; None while it has not finished, or has no ttl."""
    ttl = (body.get("spec") or {}).get("ttlSecondsAfterFinished")
    completed = (body.get("status") or {}).get("completionTime")
    if ttl is None or not completed or not ended(body):
        return None
    at = datetime.datetime.fromisoformat(str(completed))
    return at.timestamp() + float(ttl)


class FinishedJobs:
    """The deletion timers of finished jobs with a ttl (see the module docstring)."""

    def __init__(self, delete: DeleteJob, wall_clock: Callable[[], float] = time.time) -> None:
        self._delete = delete
        self._wall_clock = wall_clock
        self._timers: dict[str, tuple[float, asyncio.Task[None]]] = {}

    @property
    def due(self) -> dict[str, float]:
        """The jobs with a timer running, by uid, and when each is deleted."""
        return {uid: due for uid, (due, _) in self._timers.items()}

    def observe(self, body: Mapping[str, Any]) -> None:
        """Start, move or stop the job's timer for its latest ``body`` (the operator leads)."""
        metadata = body["metadata"]
        uid = str(metadata["uid"])
        due = deletion_due(body)
        timer = self._timers.get(uid)
        if timer is not None and timer[0] == due:
            return
        self.forget(uid)
        if due is not None:
            namespace, name = str(metadata["namespace"]), str(metadata["name"])
            task = asyncio.create_task(self._expire(due, namespace, name, uid), name=f"ttl {name}")
            self._timers[uid] = (due, task)

    def forget(self, uid: str) -> None:
        """Stop the job's timer (the job was deleted, or its ttl went)."""
        timer = self._timers.pop(uid, None)
        if timer is not None:
            timer[1].cancel()

    async def stop(self) -> None:
        """Stop every timer (the operator stops or stands down: the next leader has them)."""
        tasks = [task for _, task in self._timers.values()]
        self._timers.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _expire(self, due: float, namespace: str, name: str, uid: str) -> None:
        await asyncio.sleep(max(due - self._wall_clock(), 0.0))  # a deadline, not an event
        logger.info("job %s/%s: deleted, its ttlSecondsAfterFinished has passed", namespace, name)
        try:
            await self._delete(namespace, name, uid)
        except Exception:
            logger.exception("job %s/%s: could not delete it after its ttl", namespace, name)
        finally:
            if self._timers.get(uid, (None, None))[1] is asyncio.current_task():
                del self._timers[uid]
