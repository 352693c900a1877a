"""Writing one job's status subresource: computed (``status.status_of``) from an observation
and the status as last written, else as the job records it; patched when it changed (a change
of the training's progress alone at most every :data:`PROGRESS_WRITE_INTERVAL_S`), and always
once the job has ended (:func:`write_due`)."""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Mapping
from typing import Any, Final

from pydantic import ValidationError

from elasticjob.driver.driver_types import Clock
from elasticjob.operator.api import ElasticJobStatus, LostSeconds, Phase, worker_selector
from elasticjob.operator.kube import KubeApi
from elasticjob.operator.status_observation import Observation
from elasticjob.operator.status_render import status_of

logger = logging.getLogger(__name__)

PROGRESS_WRITE_INTERVAL_S: Final = 10.0
"""Least time between two status writes that change nothing but the training's progress (its
step, epoch, throughput, committed step), the goodput's running figures (its ratio, the
seconds lost) and the stragglers' slowdowns: rank 0 reports progress every second, and each
write is an API request plus a watch event for every watcher of the job. At 120 jobs, a
write a second each kept kube-apiserver at 85 % of a core. Any other change is written at
once, with the newest progress; the metrics endpoint has the progress live."""


def _without_progress(status: Mapping[str, Any]) -> dict[str, Any]:
    """``status`` (as written) less the fields that change with every progress report (and
    every heartbeat: a straggler's slowdown)."""
    rest = {key: value for key, value in status.items() if key != "progress"}
    goodput = rest.get("goodput")
    if isinstance(goodput, Mapping):
        rest["goodput"] = {k: v for k, v in goodput.items() if k not in ("ratio", "lostSeconds")}
    stragglers = rest.get("stragglers")
    if isinstance(stragglers, list):
        rest["stragglers"] = [
            {k: v for k, v in found.items() if k != "slowdown"} for found in stragglers
        ]
    return rest


def without_progress(obs: Observation) -> Observation:
    """``obs`` less what changes with every progress report (its part of the status is
    what :func:`_without_progress` leaves): two observations equal in this make statuses
    that differ in their progress alone."""
    goodput = obs.goodput
    if goodput is not None:
        goodput = goodput.model_copy(update={"ratio": 1.0, "lost_seconds": LostSeconds()})
    stragglers = [found.model_copy(update={"slowdown": 0.0}) for found in obs.stragglers]
    return dataclasses.replace(obs, progress=None, goodput=goodput, stragglers=stragglers)


def write_due(
    last: Mapping[str, Any] | None,
    status: Mapping[str, Any],
    *,
    last_at: float,
    now: float,
    ended: bool,
) -> bool:
    """Whether to write ``status`` (as written), ``last`` having been written at ``last_at``
    (None: nothing yet): always once the job has ended; never when nothing changed; at once
    when anything but the progress changed; a change of the progress alone once
    :data:`PROGRESS_WRITE_INTERVAL_S` has passed since the last write."""
    if ended or last is None:
        return True
    if status == last:
        return False
    if _without_progress(status) != _without_progress(last):
        return True
    return not _progress_write_waits(last_at, now)


def _progress_write_waits(last_at: float, now: float) -> bool:
    """Whether a change of the progress alone waits, the last write having been at
    ``last_at`` (a clock stepped back does not wait)."""
    return 0 <= now - last_at < PROGRESS_WRITE_INTERVAL_S


class StatusWriter:
    """Writes the status of the job ``namespace/name`` (see the module docstring)."""

    def __init__(self, api: KubeApi, namespace: str, name: str, wall_clock: Clock) -> None:
        self._api = api
        self.namespace, self.name = namespace, name
        self._wall_clock = wall_clock
        self._status: ElasticJobStatus | None = None
        self._last_written: dict[str, Any] | None = None
        self._last_written_at = 0.0
        self._steady: tuple[Observation, Any] | None = None
        """The observation (:func:`without_progress`) and generation the status last
        written, or found unchanged, was made of."""
        self.phase: Phase = Phase.CREATED
        """The phase last written."""

    def recorded(self, body: Mapping[str, Any]) -> ElasticJobStatus:
        """The status as this writer last wrote it, else as the job (``body``) records it."""
        if self._status is not None:
            return self._status
        try:
            return ElasticJobStatus.model_validate(body.get("status") or {})
        except ValidationError as exc:
            logger.warning(
                "job %s/%s: ignoring an unreadable status: %s", self.namespace, self.name, exc
            )
            return ElasticJobStatus()

    async def write(self, body: Mapping[str, Any], obs: Observation) -> None:
        """Write the status ``obs`` makes of the job (``body``: its latest version)."""
        seconds = self._wall_clock()
        generation = body.get("metadata", {}).get("generation")
        steady, ended = (without_progress(obs), generation), obs.result is not None
        waits = _progress_write_waits(self._last_written_at, seconds)
        if not ended and steady == self._steady and waits:
            return  # at most the progress changed, and its write is not due: no status to make
        now = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
        status = status_of(obs, self.recorded(body), worker_selector(self.name), generation, now)
        self._status = status
        if status.phase is not None:
            self.phase = status.phase
        dumped = status.model_dump(by_alias=True, exclude_none=True, mode="json")
        last = self._last_written
        if not write_due(last, dumped, last_at=self._last_written_at, now=seconds, ended=ended):
            self._steady = steady  # what was written, but perhaps its progress
            return
        self._last_written, self._last_written_at, self._steady = dumped, seconds, steady
        await self._api.patch_status(self.namespace, self.name, dumped)
