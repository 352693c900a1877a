"""Per-route request counters of the rendezvous service (exported as metrics by the operator).

Latency is kept as a histogram over :data:`LATENCY_BUCKETS_S` and leaves out long-polls (a
rendezvous that waits for a round, ``GET notices`` with ``wait``): their duration is the time
the worker chose to wait, not the service's speed.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
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


class RequestStats:
    """Counts requests per route and keeps a latency histogram of those that are not
    long-polls."""

    def __init__(self) -> None:
        self._routes: dict[str, RouteStats] = {}

    def record(self, route: str, status: int, seconds: float, *, long_poll: bool = False) -> None:
        """Count one request to ``route`` answered with ``status`` after ``seconds``
        (``long_poll``: it waited for news on purpose, and is left out of the latency)."""
        old = self._routes.get(route, RouteStats())
        by_status = dict(old.by_status)
        by_status[status] = by_status.get(status, 0) + 1
        new = replace(
            old, requests=old.requests + 1, errors=old.errors + (status >= 400), by_status=by_status
        )
        if not long_poll:
            buckets = list(old.latency_buckets)
            buckets[bisect.bisect_left(LATENCY_BUCKETS_S, seconds)] += 1
            new = replace(
                new,
                timed=old.timed + 1,
                latency_seconds_sum=old.latency_seconds_sum + seconds,
                latency_buckets=tuple(buckets),
            )
        self._routes[route] = new

    def snapshot(self) -> dict[str, RouteStats]:
        """The totals of every route that has been requested."""
        return dict(self._routes)
