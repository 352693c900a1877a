"""Per-route request counters of the rendezvous service (exported as metrics by the operator)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class RouteStats:
    """Totals of one route (``"METHOD /path/{template}"``) since the service started.

    ``latency_seconds_sum`` includes the time long-polls spend waiting.
    """

    requests: int = 0
    errors: int = 0
    """Requests answered with a status of 400 or more."""
    latency_seconds_sum: float = 0.0
    by_status: Mapping[int, int] = field(default_factory=dict)


class RequestStats:
    """Counts requests and sums their latency per route."""

    def __init__(self) -> None:
        self._routes: dict[str, RouteStats] = {}

    def record(self, route: str, status: int, seconds: float) -> None:
        """Count one request to ``route`` answered with ``status`` after ``seconds``."""
        old = self._routes.get(route, RouteStats())
        by_status = dict(old.by_status)
        by_status[status] = by_status.get(status, 0) + 1
        self._routes[route] = replace(
            old,
            requests=old.requests + 1,
            errors=old.errors + (status >= 400),
            latency_seconds_sum=old.latency_seconds_sum + seconds,
            by_status=by_status,
        )

    def snapshot(self) -> dict[str, RouteStats]:
        """The totals of every route that has been requested."""
        return dict(self._routes)
