"""A job's story as ``kubectl describe ej`` shows it (``status.history``): its record's events
that a user follows (rounds, failures, blacklisted hosts and until when, recoveries and their
time, scale requests, fallbacks, suspensions, stragglers, failed health checks, handovers,
the end), a line each, oldest first, stamped with UTC wall time. ``kubectl describe`` sorts
an object's fields by name, but keeps a list's order: the story reads top to bottom."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Final

from elasticjob.driver.job_record import EventKind, RecordEvent

HISTORY_KEPT: Final = 20
"""How many lines the status keeps (the newest; the job record keeps more)."""


def _stamp(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _told(event: RecordEvent) -> str | None:
    """What the line says after its time (None: the event is not part of the story)."""
    kind, message, round_number = event.kind, event.message, event.round
    if kind is EventKind.STARTED:
        return message or "job started"
    if kind is EventKind.ROUND:
        return f"round {round_number} formed: {event.world_size} workers ({message})"
    if kind is EventKind.RESUMED:
        return f"round {round_number}: training resumed" + (f", {message}" if message else "")
    if kind is EventKind.FAILURE:
        return f"round {round_number} failed: {message}"
    if kind is EventKind.BLACKLISTED:
        until = "" if event.until is None else f", until {_stamp(event.until)}"
        return f"blacklisted {message}{until}"
    if kind is EventKind.SCALE:
        return f"scale request: {message}"
    if kind is EventKind.RESTORED:
        return f"round {round_number} restored from checkpoint {message}"
    if kind is EventKind.SUSPENDED:
        return f"suspended: {message}"
    if kind is EventKind.STRAGGLER:
        return f"straggler: {message}"
    if kind is EventKind.HEALTH_CHECK_FAILED:
        return f"failed its health check, not admitted: {message}"
    if kind is EventKind.ADOPTED:
        return f"round {round_number}: {message}"
    if kind is EventKind.FINISHED:
        return f"job {message}"
    return None  # checkpoints (many, in status.lastCheckpoint) and round ends (a round follows)


def history_of(events: Sequence[RecordEvent], kept: int = HISTORY_KEPT) -> list[str]:
    """The newest ``kept`` lines of the story of ``events`` (see the module docstring)."""
    lines = [f"{_stamp(e.t)} {told}" for e in events if (told := _told(e)) is not None]
    return lines[-kept:]
