"""Per-route request counters of the rendezvous service (exported as metrics by the operator).

Latency is kept as a histogram over :data:`LATENCY_BUCKETS_S` and leaves out long-polls (a
rendezvous that waits for a round, ``GET notices`` with ``wait``): their duration is the time
the worker chose to wait, not the service's speed.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

LATENCY_BUCKETS_S: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""Upper bounds of the latency histogram's buckets (one more bucket holds the rest)."""


@dataclass(frozen=True)
class RouteStats:
    """Totals of one route (``"METHOD /path/{template}"``) since the service started."""

    requests: int = 0
    errors: int = 0
    """Requests answered with a status of 400 or more."""
    by_status: Mapping[int, int] = field(default_factory=dict)
    timed: int = 0
    """Requests in the latency histogram (all but long-polls)."""
    latency_seconds_sum: float = 0.0
    """Latency of the timed requests, summed."""
    latency_buckets: tuple[int, ...] = (0,) * (len(LATENCY_BUCKETS_S) + 1)
    """Timed requests per bucket of :data:`LATENCY_BUCKETS_S` (not cumulative; the last one
    counts those slower than every bound)."""


class _Counts:
    """The running totals of one route (mutable: counting a request allocates nothing)."""

    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.by_status: dict[int, int] = {}
        self.timed = 0
        self.latency_seconds_sum = 0.0
        self.latency_buckets = [0] * (len(LATENCY_BUCKETS_S) + 1)

    def snapshot(self) -> RouteStats:
        return RouteStats(
            requests=self.requests,
            errors=self.errors,
            by_status=dict(self.by_status),
            timed=self.timed,
            latency_seconds_sum=self.latency_seconds_sum,
            latency_buckets=tuple(self.latency_buckets),
        )


class RequestStats:
    """Counts requests per route and keeps a latency histogram of those that are not
    long-polls."""

    def __init__(self) -> None:
        self._routes: dict[str, _Counts] = {}

    def record(self, route: str, status: int, seconds: float, *, long_poll: bool = False) -> None:
        """Count one request to ``route`` answered with ``status`` after ``seconds``
        (``long_poll``: it waited for news on purpose, and is left out of the latency)."""
        counts = self._routes.get(route)
        if counts is None:
            counts = self._routes[route] = _Counts()
        counts.requests += 1
        counts.errors += status >= 400
        counts.by_status[status] = counts.by_status.get(status, 0) + 1
        if not long_poll:
            counts.timed += 1
            counts.latency_seconds_sum += seconds
            counts.latency_buckets[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1

    def snapshot(self) -> dict[str, RouteStats]:
        """The totals of every route that has been requested."""
        return {route: counts.snapshot() for route, counts in self._routes.items()}
