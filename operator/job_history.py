"""A job's story as ``kubectl describe ej`` shows it (``status.history``): its record's events
that a user follows (rounds, failures, blacklisted hosts and until when, recoveries and their
time, scale requests, fallbacks, suspensions, stragglers, failed health checks, handovers,
the end), a line each, oldest first, stamped with UTC wall time. ``kubectl describe`` sorts
an object's fields by name, but keeps a list's order: the story reads top to bottom."""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from elasticjob.driver.job_record import EventKind, RecordEvent

HISTORY_KEPT: Final = 20
"""How many lines the status keeps (the newest; the job record keeps more)."""


def _stamp(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _blacklisted(event: RecordEvent) -> str:
    until = "" if event.until is None else f", until {_stamp(event.until)}"
    return f"blacklisted {event.message}{until}"


def _resumed(event: RecordEvent) -> str:
    told = f", {event.message}" if event.message else ""
    return f"round {event.round}: training resumed{told}"


_TOLD: Final[Mapping[EventKind, Callable[[RecordEvent], str]]] = {
    EventKind.STARTED: lambda e: e.message or "job started",
    EventKind.ROUND: lambda e: f"round {e.round} formed: {e.world_size} workers ({e.message})",
    EventKind.RESUMED: _resumed,
    EventKind.FAILURE: lambda e: f"round {e.round} failed: {e.message}",
    EventKind.BLACKLISTED: _blacklisted,
    EventKind.SCALE: lambda e: f"scale request: {e.message}",
    EventKind.RESTORED: lambda e: f"round {e.round} restored from checkpoint {e.message}",
    EventKind.SUSPENDED: lambda e: f"suspended: {e.message}",
    EventKind.STRAGGLER: lambda e: f"straggler: {e.message}",
    EventKind.HEALTH_CHECK_FAILED: lambda e: f"failed its health check, not admitted: {e.message}",
    EventKind.ADOPTED: lambda e: f"round {e.round}: {e.message}",
    EventKind.FINISHED: lambda e: f"job {e.message}",
}
"""How each kind of the story reads after its time. Not in the story: checkpoints (many; the
status has the last) and round ends (a round formed follows)."""


def history_of(events: Sequence[RecordEvent], kept: int = HISTORY_KEPT) -> list[str]:
    """The newest ``kept`` lines of the story of ``events`` (see the module docstring)."""
    lines = [f"{_stamp(e.t)} {_TOLD[e.kind](e)}" for e in events if e.kind in _TOLD]
    return lines[-kept:]
