"""Per-job bounds of the rendezvous service, sized from the job's maximum worker count and
capped by the service's own capacity.

One service serves every job of an operator, so no job may take more than its share of it.
The bounds follow from a worker's normal traffic (:data:`NORMAL_REQUESTS_PER_WORKER_S`):
one heartbeat per second at most, one notices long-poll re-issued at most once a second,
rendezvous long-polls around a round change, a result at its end and, from rank 0, progress
at most once a second; that is at most 3 requests a second and 2 long-polls held at once per
worker. Every bound gives :data:`HEADROOM` times that, and no job's sustained rate exceeds
:data:`MAX_JOB_SHARE` of what the service answers (:data:`SERVICE_REQUESTS_PER_S`), however
large the job, unless its workers' heartbeats alone need more (``beats``: workers times beats
a second, with :data:`BEAT_HEADROOM`; the table's figure is at one beat a second): one job at
its rate leaves the other half of the service to every other job, and a large job's own
heartbeats are never refused (a worker that cannot beat would be taken for dead).

================================  =======================================  =============
bound                             formula                                  1,024 workers
================================  =======================================  =============
requests per second (sustained)   min(max(100, 3 x 10 x max_workers),      1,536
                                  max(0.5 x 2,800, 1.5 x beats))
burst (requests at once)          max(2 s of the sustained rate,           4,096
                                  4 x max_workers)
long-polls held at once           max(20, 2 x 10 x max_workers)            20,480
request bodies being read         min(max(16, 2 x max_workers), 256)       256
rendezvous rounds kept per worker :data:`ANNOUNCED_ROUNDS_PER_WORKER`      16
================================  =======================================  =============

The burst covers a failure of the largest job (about 3 requests per survivor within a
second, ``docs/scale.md``). A request whose body is still arriving holds a connection and a
handler without being a long-poll: a job may have :attr:`JobLimits.bodies` of them at once,
each for at most ``request_bodies.BODY_TIMEOUT_S``.

Everything else a job keeps is bounded by the workers its driver launched (registrations and
results of other workers are refused), by :data:`~elasticjob.rendezvous.notice_log.MAX_NOTICES`
notices, and by the largest request body (``request_bodies.MAX_BODY_BYTES``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Final

from elasticjob.rendezvous.rendezvous_types import Refusal, RequestRefused

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
"""A job may send this many seconds of its sustained rate at once..."""
BURST_REQUESTS_PER_WORKER: Final = 4
"""... or this many requests per worker, if more: a failure costs every survivor about 3."""
SERVICE_REQUESTS_PER_S: Final = 2_800.0
"""Requests a second the service's event loop answers (about 0.35 ms of CPU each, measured
by ``bench/scale.py``, ``docs/scale.md``)."""
MAX_JOB_SHARE: Final = 0.5
"""The largest share of :data:`SERVICE_REQUESTS_PER_S` one job's sustained rate may be, unless
its heartbeats need more."""
BEAT_HEADROOM: Final = 1.5
"""A job's sustained rate is at least this many times its workers' heartbeats a second."""
BODIES_PER_WORKER: Final = 2
"""Request bodies one worker sends at once at most (a heartbeat beside a result or a
rendezvous request)."""
MIN_BODIES: Final = 16
"""Bodies a job of a few workers may have in flight at least."""
MAX_BODIES: Final = 256
"""Bodies any job may have in flight at most."""
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
    bodies: int
    """Requests whose body is still being read, at once."""

    @classmethod
    def for_workers(cls, max_workers: int, heartbeat_interval_s: float | None = 1.0) -> JobLimits:
        """The bounds of a job of at most ``max_workers`` workers (at least 1) that beat every
        ``heartbeat_interval_s`` (None: they do not beat)."""
        if max_workers < 1:
            raise ValueError(f"a job's maximum worker count must be >= 1, got {max_workers}")
        wanted = max(MIN_REQUESTS_PER_S, NORMAL_REQUESTS_PER_WORKER_S * HEADROOM * max_workers)
        beats = max_workers / heartbeat_interval_s if heartbeat_interval_s else 0.0
        share = max(MAX_JOB_SHARE * SERVICE_REQUESTS_PER_S, BEAT_HEADROOM * beats)
        rate = min(wanted, share)
        return cls(
            requests_per_s=rate,
            burst=max(rate * BURST_SECONDS, BURST_REQUESTS_PER_WORKER * max_workers),
            long_polls=max(MIN_LONG_POLLS, LONG_POLLS_PER_WORKER * HEADROOM * max_workers),
            bodies=min(max(MIN_BODIES, BODIES_PER_WORKER * max_workers), MAX_BODIES),
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


class InFlight:
    """Counts what a job holds at once (its request bodies being read), refusing beyond
    ``limit`` (:attr:`Refusal.TOO_MANY_BODIES`, before anything is held)."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self.held = 0

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Hold one for the ``with`` block."""
        if self.held >= self._limit:
            raise RequestRefused(
                Refusal.TOO_MANY_BODIES, f"the job has {self.held} request bodies in flight"
            )
        self.held += 1
        try:
            yield
        finally:
            self.held -= 1
