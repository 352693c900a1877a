"""The Kubernetes events of one job, queued as they are recorded and posted by the job's
controller on its next pass: each event added to the job's record (the journal pushes it,
``journal_events.Recorded``) makes the event the one table of ``job_story.py`` says, whether
the driver learnt the fact or the controller did (it tells the driver, which records it).
Nothing is found by comparing what was announced before."""

from __future__ import annotations

from collections.abc import Callable

from elasticjob.driver.job_record import RecordEvent
from elasticjob.driver.journal_events import JournalEvent, Recorded
from elasticjob.operator.api import BlacklistScope
from elasticjob.operator.job_story import JobEvent, event_of


class JobEvents:
    """The events of one job waiting to be posted."""

    def __init__(self, scope: BlacklistScope, wake: Callable[[], None]) -> None:
        """``wake``: run the controller's next pass soon (it posts them)."""
        self.scope = scope
        self._wake = wake
        self._queued: list[JobEvent] = []

    def on_journal(self, event: JournalEvent) -> None:
        """A subscriber of the driver's journal: queue the event a recorded event makes."""
        if isinstance(event, Recorded):
            self.told(event.event)

    def told(self, event: RecordEvent) -> None:
        """Queue the Kubernetes event ``event`` makes, if it makes one (the journal's, or one
        the controller learnt while the job has no driver to record it)."""
        made = event_of(event, self.scope)
        if made is not None:
            self._queued.append(made)
            self._wake()

    def take(self) -> list[JobEvent]:
        """The queued events, oldest first; the queue is left empty."""
        taken, self._queued = self._queued, []
        return taken
