"""This worker's step pace: how long its recent steps kept it busy, sent with its heartbeats so
that the driver can find a straggler (``elasticjob.driver.stragglers``).

A step's busy time is its wall time (from the previous step's end to this one's) less the
time this worker waited in the group's blocking operations meanwhile (``RoundGroup``'s
``blocked_total``): in a synchronous job the fast ranks wait for the slow one in the step's
collectives, so the slow one has the longest busy time. The pace is the median of the last
:data:`WINDOW` steps of the round, which one slow step (a checkpoint, a garbage collection)
does not move; a new round starts afresh (its first step includes joining it).
"""

from __future__ import annotations

import collections
import statistics
import threading
import time
from collections.abc import Callable
from typing import Final

from elasticjob.wire.messages import StepPace

WINDOW: Final = 32
"""Steps the median is taken over."""


class StepPaceMeter:
    """Times this worker's steps (:meth:`step_done`, on the training thread) and tells its
    pace (:meth:`pace`, from any thread). ``blocked_total``: the seconds the worker has spent
    waiting in collectives so far."""

    def __init__(
        self, blocked_total: Callable[[], float], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._blocked_total = blocked_total
        self._clock = clock
        self._lock = threading.Lock()
        self._round = -1
        self._steps = 0
        self._last: tuple[float, float] | None = None
        self._busy: collections.deque[float] = collections.deque(maxlen=WINDOW)

    def step_done(self, round_number: int) -> None:
        """A step of ``round_number`` ended now."""
        now, blocked = self._clock(), self._blocked_total()
        with self._lock:
            if round_number != self._round:
                self._round, self._steps, self._last = round_number, 0, None
                self._busy.clear()
            if self._last is not None:
                last_at, last_blocked = self._last
                self._busy.append(max((now - last_at) - (blocked - last_blocked), 0.0))
                self._steps += 1
            self._last = (now, blocked)

    def pace(self) -> StepPace | None:
        """The pace of this round's recent steps (None: none measured yet)."""
        with self._lock:
            if not self._busy:
                return None
            busy = statistics.median(self._busy)
            return StepPace(round=self._round, steps=self._steps, busy_s=busy)
