"""The Kubernetes events of one job, queued as the facts are learnt and posted by the job's
controller on its next pass: what the controller learns itself (a worker pod failed, a pod
leaves) and what the driver's journal pushes (a round formed, a checkpoint restored, a node or
pod blacklisted: :func:`event_of`). Nothing is found by comparing what was announced before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from elasticjob.driver.journal_events import (
    CheckpointRestored,
    HealthChecked,
    HostBlacklisted,
    JournalEvent,
    RoundPublished,
    StragglerFound,
)
from elasticjob.operator.api import BlacklistScope


@dataclass(frozen=True)
class JobEvent:
    """A Kubernetes event on the ElasticJob."""

    reason: str
    message: str
    warning: bool = False


def event_of(event: JournalEvent, scope: BlacklistScope) -> JobEvent | None:
    """The Kubernetes event a journal event makes (None: none); ``scope``: what the job
    blacklists (nodes or pods)."""
    if isinstance(event, RoundPublished):
        hosts = ", ".join(event.hosts)
        return JobEvent(
            "RoundFormed", f"round {event.round}: {event.world_size} workers in {hosts}"
        )
    if isinstance(event, CheckpointRestored):
        restore = event.restore
        lost = "an unknown number of" if restore.steps_lost is None else restore.steps_lost
        cause = "resumed after a suspension" if restore.resumed else "no worker survived"
        return JobEvent(
            "RestoredFromCheckpoint",
            f"{cause}: round {restore.round} resumed from checkpoint "
            f"{restore.checkpoint.name} (step {restore.checkpoint.step}); {lost} committed "
            "steps are trained again",
            warning=not restore.resumed or restore.steps_lost != 0,
        )
    if isinstance(event, StragglerFound):
        return JobEvent(
            "StragglerDetected",
            f"rank {event.rank} in pod {event.host} is a straggler in round {event.round}: its "
            f"steps keep it busy {event.slowdown:.2f}x as long as the other workers'",
            warning=True,
        )
    if isinstance(event, HealthChecked):
        took = "" if event.seconds is None else f" in {event.seconds:.1f} s"
        where = f"pod {event.host}" + (f" on node {event.node}" if event.node else "")
        if event.passed:
            return JobEvent(
                "HealthCheckPassed", f"{where} passed its health check{took}: {event.reason}"
            )
        return JobEvent(
            "HealthCheckFailed",
            f"{where} failed its health check{took}: {event.reason}; it is not admitted",
            warning=True,
        )
    if isinstance(event, HostBlacklisted):
        what = "node" if scope is BlacklistScope.NODE else "pod"
        return JobEvent(f"{what.capitalize()}Blacklisted", f"{what} {event.host} blacklisted", True)
    return None


class JobEvents:
    """The events of one job waiting to be posted."""

    def __init__(self, scope: BlacklistScope, wake: Callable[[], None]) -> None:
        """``wake``: run the controller's next pass soon (it posts them)."""
        self.scope = scope
        self._wake = wake
        self._queued: list[JobEvent] = []

    def add(self, reason: str, message: str, *, warning: bool = False) -> None:
        """Queue an event the controller learnt of."""
        self._queued.append(JobEvent(reason, message, warning))
        self._wake()

    def on_journal(self, event: JournalEvent) -> None:
        """A subscriber of the driver's journal: queue the event ``event`` makes."""
        made = event_of(event, self.scope)
        if made is not None:
            self._queued.append(made)
            self._wake()

    def take(self) -> list[JobEvent]:
        """The queued events, oldest first; the queue is left empty."""
        taken, self._queued = self._queued, []
        return taken
