"""Writing one job's status subresource: computed (``status.status_of``) from an observation
and the status as last written, else as the job records it; patched only when it changed,
and always once the job has ended."""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from elasticjob.driver.api import Clock
from elasticjob.operator.api import ElasticJobStatus, Phase, worker_selector
from elasticjob.operator.kube import KubeApi
from elasticjob.operator.status import Observation, status_of

logger = logging.getLogger(__name__)


class StatusWriter:
    """Writes the status of the job ``namespace/name`` (see the module docstring)."""

    def __init__(self, api: KubeApi, namespace: str, name: str, wall_clock: Clock) -> None:
        self._api = api
        self.namespace, self.name = namespace, name
        self._wall_clock = wall_clock
        self._status: ElasticJobStatus | None = None
        self._last_written: dict[str, Any] | None = None
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
        now = datetime.datetime.fromtimestamp(self._wall_clock(), datetime.UTC)
        generation = body.get("metadata", {}).get("generation")
        status = status_of(obs, self.recorded(body), worker_selector(self.name), generation, now)
        self._status = status
        if status.phase is not None:
            self.phase = status.phase
        dumped = status.model_dump(by_alias=True, exclude_none=True, mode="json")
        if dumped == self._last_written and obs.result is None:
            return
        self._last_written = dumped
        await self._api.patch_status(self.namespace, self.name, dumped)
