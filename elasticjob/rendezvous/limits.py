"""Per-job bounds of the rendezvous service, sized from the job's maximum worker count.

One service serves every job of an operator, so no job may take more than its share of it.
The bounds follow from a worker's normal traffic (:data:`NORMAL_REQUESTS_PER_WORKER_S`):
one heartbeat per second at most, one notices long-poll re-issued at most once a second,
rendezvous long-polls around a round change, a result at its end and, from rank 0, progress
at most once a second; that is at most 3 requests a second and 2 long-polls held at once per
worker. Every bound gives :data:`HEADROOM` times that:

================================  =======================================  =============
bound                             formula                                  1,024 workers
================================  =======================================  =============
requests per second (sustained)   max(100, 3 x 10 x max_workers)           30,720
burst (requests at once)          2 s of the sustained rate                61,440
long-polls held at once           max(20, 2 x 10 x max_workers)            20,480
rendezvous rounds kept per worker :data:`ANNOUNCED_ROUNDS_PER_WORKER`      16
================================  =======================================  =============

Everything else a job keeps is bounded by the workers its driver launched (registrations and
results of other workers are refused), by :data:`~elasticjob.rendezvous.notice_log.MAX_NOTICES`
notices, and by the largest request body (``routes.MAX_BODY_BYTES``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

HEADROOM: Final = 10
"""How many times a job's normal traffic its bounds allow."""
NORMAL_REQUESTS_PER_WORKER_S: Final = 3
"""Requests a second one worker sends at most when all is well."""
LONG_POLLS_PER_WORKER: Final = 2
"""Long-polls one worker holds at most when all is well (a rendezvous and a notices poll)."""
MIN_REQUESTS_PER_S: Final = 100.0
"""Sustained rate a job of a few workers gets at least."""
MIN_LONG_POLLS: Final = 20
"""Long-polls a job of a few workers may hold at least."""
BURST_SECONDS: Final = 2.0
"""A job may send this many seconds of its sustained rate at once."""
ANNOUNCED_ROUNDS_PER_WORKER: Final = 16
"""How many of a worker's ``after_round`` values a job remembers (to tell its driver about
each once); older ones are forgotten first."""
DEFAULT_MAX_WORKERS: Final = 1024
"""The maximum worker count of a job whose owner did not give one."""


@dataclass(frozen=True)
class JobLimits:
    """The bounds of one job (see the module docstring)."""

    requests_per_s: float
    burst: float
    long_polls: int

    @classmethod
    def for_workers(cls, max_workers: int) -> JobLimits:
        """The bounds of a job of at most ``max_workers`` workers (at least 1)."""
        if max_workers < 1:
            raise ValueError(f"a job's maximum worker count must be >= 1, got {max_workers}")
        rate = max(MIN_REQUESTS_PER_S, NORMAL_REQUESTS_PER_WORKER_S * HEADROOM * max_workers)
        return cls(
            requests_per_s=rate,
            burst=rate * BURST_SECONDS,
            long_polls=max(MIN_LONG_POLLS, LONG_POLLS_PER_WORKER * HEADROOM * max_workers),
        )


class TokenBucket:
    """A token bucket: ``rate`` tokens a second, holding at most ``burst``; starts full."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float]) -> None:
        self._rate = rate
        self._burst = burst
        self._clock = clock
        self._tokens = burst
        self._at = clock()

    def take(self) -> float:
        """Take one token: 0.0 if there was one, else the seconds until there is one (and
        nothing is taken)."""
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._at) * self._rate)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self._rate
