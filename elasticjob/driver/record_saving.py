"""When a job's record is saved: one policy for both front ends, which differ only in where
they keep it (the operator in a ConfigMap, the local launcher in a file: a
:class:`RecordStore`).

The journal pushes every change of the record (:class:`~elasticjob.driver.journal.
RecordChanged`) to the job's :class:`RecordSaver`, which saves it once :func:`save_due`: at
once when the job's state changed (what a new driver resumes from, ``job_state.py``: a round,
a failure, a notice, a blacklisting; rare), at most every :data:`SAVE_INTERVAL_S` for another
event, every :data:`SAMPLES_SAVE_INTERVAL_S` for progress samples alone, and at once when the
job ends (:meth:`RecordSaver.save_now`). Nothing is polled: the saver sleeps until a change
makes a save due.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final, Protocol

from elasticjob.driver.driver_types import Clock
from elasticjob.driver.job_record import JobRecordData, RecordChange
from elasticjob.driver.job_state import JobState
from elasticjob.driver.journal import JobJournal
from elasticjob.driver.journal_events import JournalEvent, RecordChanged
from elasticjob.event_waits import wait_event

logger = logging.getLogger(__name__)

SAVE_INTERVAL_S: Final = 10.0
"""Least time between two saves of a record that has a new event."""
SAMPLES_SAVE_INTERVAL_S: Final = 60.0
"""Least time between two saves of a record that has new progress samples alone: a running
job samples its progress every second, its record grows to a few hundred kB, and at 200 jobs
a save every 10 s each was 20 ConfigMap writes a second for the API server and etcd."""


def save_wait_s(changed: RecordChange, since_saved: float | None) -> float | None:
    """How long until a record with ``changed`` (:class:`RecordChange`), last saved
    ``since_saved`` seconds ago (None: not yet by this process), is due: None when nothing
    changed, 0 when it is due now (a clock stepped back makes it due)."""
    if changed is RecordChange.NONE:
        return None
    if changed is RecordChange.STATE or since_saved is None or since_saved < 0:
        return 0.0
    interval = SAVE_INTERVAL_S if changed is RecordChange.EVENTS else SAMPLES_SAVE_INTERVAL_S
    return max(0.0, interval - since_saved)


def save_due(changed: RecordChange, since_saved: float | None, *, now: bool) -> bool:
    """Whether to save a record with ``changed``, last saved ``since_saved`` seconds ago:
    never when nothing changed; with ``now`` (the job ends) at once; else once the interval of
    the change's kind has passed (see :func:`save_wait_s`)."""
    wait = save_wait_s(changed, since_saved)
    return wait is not None and (now or wait == 0.0)


class RecordStore(Protocol):
    """Where a front end keeps a job's record."""

    async def save(self, data: JobRecordData) -> None:
        """Store ``data``; raise :class:`OSError` (or the store's own error, logged by the
        caller) when it could not: the next change tries again."""


class RecordSaver:
    """Saves one job's record as its journal changes it (see the module docstring)."""

    def __init__(
        self,
        journal: JobJournal,
        store: RecordStore,
        clock: Clock,
        state: Callable[[], JobState],
        errors: tuple[type[BaseException], ...] = (OSError,),
    ) -> None:
        """``state``: the job's state now (``ElasticDriver.job_state``); ``errors``: what a
        failed save of ``store`` raises (logged; tried again later)."""
        self._journal = journal
        self._state = state
        self._store = store
        self._clock = clock
        self._errors = errors
        self._saved_at: float | None = None
        self._due_at: float | None = None
        """When the change not saved yet is due (None: nothing is waiting)."""
        self._wake = asyncio.Event()
        journal.subscribe(self._on_event)

    def _on_event(self, event: JournalEvent) -> None:
        if not isinstance(event, RecordChanged):
            return
        wait = save_wait_s(event.change, self._since_saved())
        if wait is None:
            return
        due = self._clock() + wait
        if self._due_at is None or due < self._due_at:
            self._due_at = due
            self._wake.set()

    async def run(self) -> None:
        """Save the record whenever a change is due, until cancelled."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            wait = self.due_in()
            if wait is None:
                self._due_at = None
                continue
            if wait > 0 and await wait_event(self._wake, wait):
                continue  # a change due sooner came: wait for that one instead
            await self.save_if_due()

    def due_in(self) -> float | None:
        """Seconds until the record's changes are due to be saved (None: nothing changed)."""
        return save_wait_s(self._journal.record.changed, self._since_saved())

    async def save_if_due(self) -> None:
        """Save the record if its changes are due (see :func:`save_due`)."""
        if save_due(self._journal.record.changed, self._since_saved(), now=False):
            await self.save_now()

    async def save_now(self) -> None:
        """Save the record now if anything changed since it was saved (the job ends)."""
        record = self._journal.record
        self._due_at = None
        if record.changed is RecordChange.NONE:
            return
        try:
            await self._store.save(self._journal.record_data(self._state()))
            record.saved()
        except self._errors as exc:
            logger.warning("could not save the record of job %s: %s", record.job, exc)
        self._saved_at = self._clock()

    def _since_saved(self) -> float | None:
        return None if self._saved_at is None else self._clock() - self._saved_at
