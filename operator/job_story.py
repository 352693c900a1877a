"""How a job's record tells its story, by one table (:data:`TOLD`): for each kind of record
event (``job_record.EventKind``), its line in ``status.history`` and the Kubernetes event on
the ElasticJob (reason, message; a warning when the record event is bad news).

The story (``kubectl describe ej``): the events a user follows (rounds, failures, blacklisted
hosts and until when, recoveries and their time, scale requests, fallbacks, suspensions,
stragglers, failed health checks, handovers, the end), a line each, oldest first, stamped with
UTC wall time (:func:`history_of`). ``kubectl describe`` sorts an object's fields by name, but
keeps a list's order: the story reads top to bottom. Kubernetes events (:func:`event_of`) are
posted as the events are recorded; the controller's own (``Created``, ``Resumed``,
``Suspended``, ``Succeeded``, ``Failed``, ``InvalidSpec``) are its, not the record's.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from elasticjob.driver.job_record import EventKind, RecordEvent
from elasticjob.operator.api import BlacklistScope

HISTORY_KEPT: Final = 20
"""How many lines the status keeps (the newest; the job record keeps more)."""


@dataclass(frozen=True)
class JobEvent:
    """A Kubernetes event on the ElasticJob."""

    reason: str
    message: str
    warning: bool = False


@dataclass(frozen=True)
class Telling:
    """How one kind of record event is told."""

    line: Callable[[RecordEvent], str] | None
    """Its line in the story after its time (None: not in the story)."""
    reason: str | None = None
    """Its Kubernetes event's reason (None: none is posted); ``{scope}`` is the job's
    blacklist scope (``Node`` or ``Pod``)."""
    message: Callable[[RecordEvent], str] | None = None
    """Its Kubernetes event's message (None: its line)."""


def _stamp(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _blacklisted(event: RecordEvent) -> str:
    until = "" if event.until is None else f", until {_stamp(event.until)}"
    return f"blacklisted {event.message}{until}"


def _resumed(event: RecordEvent) -> str:
    told = f", {event.message}" if event.message else ""
    return f"round {event.round}: training resumed{told}"


def _round(event: RecordEvent) -> str:
    return f"round {event.round} formed: {event.world_size} workers ({event.message})"


TOLD: Final[Mapping[EventKind, Telling]] = {
    EventKind.STARTED: Telling(lambda e: e.message or "job started"),
    EventKind.ROUND: Telling(_round, "RoundFormed"),
    EventKind.RESUMED: Telling(_resumed),
    EventKind.RESIZED: Telling(None),
    EventKind.FAILURE: Telling(lambda e: f"round {e.round} failed: {e.message}"),
    EventKind.WORKER_FAILED: Telling(None, "WorkerFailed", lambda e: f"pod {e.message}"),
    EventKind.BLACKLISTED: Telling(_blacklisted, "{scope}Blacklisted"),
    EventKind.SCALE: Telling(lambda e: f"scale request: {e.message}"),
    EventKind.LEAVING: Telling(None, "ScalingIn", lambda e: f"pod {e.host} leaves the job"),
    EventKind.CLAMPED: Telling(lambda e: f"replicas clamped: {e.message}", "ReplicasClamped"),
    EventKind.CREATE_REFUSED: Telling(lambda e: f"pods not created: {e.message}", "FailedCreate"),
    EventKind.CHECKPOINT: Telling(None),
    EventKind.RESTORED: Telling(
        lambda e: f"round {e.round} restored from checkpoint {e.message}",
        "RestoredFromCheckpoint",
    ),
    EventKind.ADOPTED: Telling(lambda e: f"round {e.round}: {e.message}"),
    EventKind.STRAGGLER: Telling(lambda e: f"straggler: {e.message}", "StragglerDetected"),
    EventKind.HEALTH_CHECK_PASSED: Telling(None, "HealthCheckPassed", lambda e: f"pod {e.message}"),
    EventKind.HEALTH_CHECK_FAILED: Telling(
        lambda e: f"not admitted: {e.message}",
        "HealthCheckFailed",
        lambda e: f"pod {e.message}; it is not admitted",
    ),
    EventKind.SUSPENDED: Telling(lambda e: f"suspended: {e.message}"),
    EventKind.FINISHED: Telling(lambda e: f"job {e.message}"),
}
"""How each kind of record event is told (see the module docstring). Not in the story:
checkpoints (many; the status has the last), round ends (a round formed follows), and what
the Kubernetes events tell of one worker (its failure, its leaving, its health check)."""


def history_of(events: Sequence[RecordEvent], kept: int = HISTORY_KEPT) -> list[str]:
    """The newest ``kept`` lines of the story of ``events`` (see the module docstring)."""
    lines = []
    for event in events:
        line = TOLD[event.kind].line
        if line is not None:
            lines.append(f"{_stamp(event.t)} {line(event)}")
    return lines[-kept:]


def event_of(event: RecordEvent, scope: BlacklistScope) -> JobEvent | None:
    """The Kubernetes event that ``event`` makes (None: none); ``scope``: what the job
    blacklists (nodes or pods)."""
    told = TOLD[event.kind]
    if told.reason is None:
        return None
    render = told.message or told.line
    assert render is not None, f"{event.kind} posts an event with nothing to say"
    return JobEvent(told.reason.format(scope=scope.value), render(event), event.warning)
