"""When a job's record is saved (one policy for both front ends): the table of what is due,
and the saver the journal pushes each change to, against a real event loop."""

from __future__ import annotations

import asyncio

import pytest

from elasticjob.driver.job_record import EventKind, JobRecordData, RecordChange
from elasticjob.driver.job_state import JobState
from elasticjob.driver.journal import JobJournal
from elasticjob.driver.record_saving import (
    SAMPLES_SAVE_INTERVAL_S,
    SAVE_INTERVAL_S,
    RecordSaver,
    save_due,
    save_wait_s,
)
from tests.support.clock import FakeClock

DEADLINE = 5.0


class Store:
    """A record store that keeps what it was given and can fail."""

    def __init__(self) -> None:
        self.saved: list[JobRecordData] = []
        self.down = False
        self.changed = asyncio.Event()

    async def save(self, data: JobRecordData) -> None:
        if self.down:
            raise OSError("disk full")
        self.saved.append(data)
        self.changed.set()


T, E, S, N = RecordChange.STATE, RecordChange.EVENTS, RecordChange.SAMPLES, RecordChange.NONE


@pytest.mark.parametrize(
    ("changed", "since_saved", "now", "due"),
    [
        (N, None, False, False),  # nothing to save, even the first time
        (N, 1e6, True, False),  # nor when the job ends
        (E, None, False, True),  # the first save of this operator
        (S, None, False, True),
        (E, 1.0, True, True),  # the job ends: at once
        (S, 1.0, True, True),
        (T, 0.1, False, True),  # the job's state changed: at once, always
        (E, SAVE_INTERVAL_S - 0.1, False, False),  # an event: every SAVE_INTERVAL_S
        (E, SAVE_INTERVAL_S, False, True),
        (S, SAVE_INTERVAL_S, False, False),  # samples alone: every SAMPLES_SAVE_INTERVAL_S
        (S, SAMPLES_SAVE_INTERVAL_S - 0.1, False, False),
        (S, SAMPLES_SAVE_INTERVAL_S, False, True),
        (S, -5.0, False, True),  # a clock stepped back saves
    ],
)
def test_when_a_record_is_saved(
    changed: RecordChange, since_saved: float | None, now: bool, due: bool
) -> None:
    assert save_due(changed, since_saved, now=now) is due


@pytest.mark.parametrize(
    ("changed", "since_saved", "wait"),
    [
        (N, None, None),
        (N, 3.0, None),
        (E, None, 0.0),
        (E, 4.0, SAVE_INTERVAL_S - 4.0),
        (T, 4.0, 0.0),
        (S, 4.0, SAMPLES_SAVE_INTERVAL_S - 4.0),
        (E, SAVE_INTERVAL_S + 1.0, 0.0),
        (S, -1.0, 0.0),
    ],
)
def test_how_long_until_a_save_is_due(
    changed: RecordChange, since_saved: float | None, wait: float | None
) -> None:
    assert save_wait_s(changed, since_saved) == wait


async def test_the_saver_saves_a_change_pushed_by_the_journal_without_being_asked() -> None:
    clock, store = FakeClock(1000.0), Store()
    journal = JobJournal(clock)
    saver = RecordSaver(journal, store, clock, JobState)
    running = asyncio.create_task(saver.run())
    try:
        journal.start_record("job", lambda: 1.0, "started")
        await asyncio.wait_for(store.changed.wait(), DEADLINE)
        assert [e.kind for e in store.saved[0].events] == [EventKind.STARTED]
        assert journal.record.changed is RecordChange.NONE
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


async def test_a_change_waits_for_its_interval_and_a_failed_save_is_tried_again() -> None:
    clock, store = FakeClock(1000.0), Store()
    journal = JobJournal(clock)
    saver = RecordSaver(journal, store, clock, JobState)
    journal.start_record("job", lambda: 1.0, "started")
    await saver.save_if_due()
    journal.straggler("pod-1", 1, 2.5, 1)
    await saver.save_if_due()
    assert len(store.saved) == 1, "an event waits for its interval"
    assert saver.due_in() == SAVE_INTERVAL_S
    clock.now += SAVE_INTERVAL_S
    store.down = True
    await saver.save_if_due()
    assert journal.record.changed is RecordChange.EVENTS, "not saved: still changed"
    store.down = False
    clock.now += SAVE_INTERVAL_S
    await saver.save_if_due()
    assert [e.kind for e in store.saved[-1].events][-1] is EventKind.STRAGGLER
    journal.blacklisted("node-1", 10.0, 1)
    await saver.save_if_due()
    assert [e.kind for e in store.saved[-1].events][-1] is EventKind.BLACKLISTED, "at once"


async def test_save_now_saves_only_what_changed() -> None:
    clock, store = FakeClock(1000.0), Store()
    journal = JobJournal(clock)
    saver = RecordSaver(journal, store, clock, JobState)
    await saver.save_now()
    assert store.saved == [], "nothing changed"
    journal.record.sample(2, 10.0)
    await saver.save_now()
    assert len(store.saved) == 1
