"""How late an event loop runs its timers, watched once for every driver on the loop.

A driver's loop that runs a timer :data:`~elasticjob.driver.liveness.LOOP_LAG_S` late was too
busy to keep up, and the heartbeats may have waited in its queues
(:meth:`Reachability.loop_ran_late`). The operator runs every job's driver on one loop: one
watch serves them all (a probe per driver was 400 timers a second at 200 jobs, each telling
the same thing). The watch runs while at least one driver is subscribed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Iterator
from typing import Final

from elasticjob.driver.driver_types import Clock
from elasticjob.driver.liveness import LOOP_LAG_S, Reachability

logger = logging.getLogger(__name__)

PROBE_S: Final = 0.5
"""How often the watch checks how late the loop runs."""
QUIET_S: Final = 60.0
"""A late loop is a warning when it had kept time this long (else a debug line)."""


class LoopLagWatch:
    """Checks every :data:`PROBE_S` how late the running loop wakes a timer, and tells the
    subscribed drivers' :class:`Reachability` when it ran late."""

    def __init__(self, clock: Clock, probe_s: float = PROBE_S) -> None:
        self._clock = clock
        self._probe_s = probe_s
        self._subscribers: list[Reachability] = []
        self._task: asyncio.Task[None] | None = None
        self._lagged_at = -math.inf
        self._due = math.inf

    @contextlib.contextmanager
    def subscribed(self, reachability: Reachability) -> Iterator[None]:
        """Tell ``reachability`` while the block runs (inside a running loop)."""
        try:
            self._subscribers.append(reachability)
            if self._task is None or self._task.done():
                self._task = asyncio.get_running_loop().create_task(self._run(), name="loop lag")
            yield
        finally:
            self._subscribers.remove(reachability)
            if not self._subscribers and self._task is not None:
                self._task.cancel()
                self._task = None
                self._due = math.inf

    async def _run(self) -> None:
        while True:
            self._due = self._clock() + self._probe_s
            await asyncio.sleep(self._probe_s)
            self._tell(self._clock())

    def catch_up(self) -> None:
        """Tell the subscribers now if the watch's next check is overdue by
        :data:`~elasticjob.driver.liveness.LOOP_LAG_S`. A driver calls it before it judges
        silence: after the loop was blocked, the driver's own timer may run before the
        watch's, and it would kill workers whose beats still wait in the loop's queues."""
        now = self._clock()
        if now - self._due >= LOOP_LAG_S:
            self._tell(now)
            self._due = now  # told up to now: the overdue check counts from here

    def _tell(self, now: float) -> None:
        late = [r.loop_ran_late(now - self._due, now) for r in self._subscribers]
        if any(late):
            quiet = now - self._lagged_at > QUIET_S
            self._lagged_at = now
            (logger.warning if quiet else logger.debug)(
                "the event loop ran %.1f s late: heartbeat silence counts from now", now - self._due
            )
