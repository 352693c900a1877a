"""A job record stays bounded, keeps the job's start and spans the whole job."""

from __future__ import annotations

from elasticjob.driver.goodput import LostTo
from elasticjob.driver.job_record import (
    MAX_EVENTS,
    MAX_SAMPLES,
    EventKind,
    JobRecord,
    JobRecordData,
    RecordChange,
)
from elasticjob.driver.job_state import JobState
from tests.support.clock import FakeClock


def test_events_are_bounded_and_the_start_is_kept() -> None:
    clock = FakeClock(1_000_000.0)
    record = JobRecord("ns.job", clock)
    record.event(EventKind.STARTED, "created")
    for n in range(MAX_EVENTS + 50):
        clock.now += 1
        record.event(EventKind.ROUND, round=n + 1, world_size=2)
    data = record.data(JobState(), 1.0)
    assert len(data.events) == MAX_EVENTS
    assert data.events[0].kind is EventKind.STARTED
    assert data.events[-1].round == MAX_EVENTS + 50


def test_samples_are_thinned_so_that_they_span_the_whole_job() -> None:
    clock = FakeClock(1_000_000.0)
    record = JobRecord("ns.job", clock)
    start = clock.now
    for n in range(3 * MAX_SAMPLES):
        clock.now += 2.0
        record.sample(4 + n % 2, 100.0)
    samples = record.data(JobState(), 1.0).samples
    assert len(samples) <= MAX_SAMPLES
    assert samples[0].t == start + 2.0 and samples[-1].t == clock.now
    assert [s.t for s in samples] == sorted(s.t for s in samples)


def test_close_samples_of_the_same_world_replace_each_other() -> None:
    clock = FakeClock(1_000_000.0)
    record = JobRecord("ns.job", clock)
    for _ in range(3):
        clock.now += 0.2
        record.sample(4, 10.0)
    clock.now += 0.2
    record.sample(2, 5.0)
    sizes = [s.world_size for s in record.data(JobState(), 1.0).samples]
    assert sizes == [4, 4, 2], "a change of the world is always kept"


def test_a_stored_record_is_carried_on_and_changes_are_tracked() -> None:
    clock = FakeClock(1_000_000.0)
    record = JobRecord("ns.job", clock)
    record.event(EventKind.STARTED)
    data = record.data(JobState(lost_seconds={LostTo.RECOVERY: 1.235}), 0.987654)
    assert record.changed is RecordChange.EVENTS, "until it is saved"
    record.saved()
    assert record.changed is RecordChange.NONE and not record.changed
    record.sample(4, 10.0)
    assert record.changed is RecordChange.SAMPLES
    record.event(EventKind.STRAGGLER)
    record.sample(4, 10.0)
    assert record.changed is RecordChange.EVENTS, "an event outweighs samples"
    record.event(EventKind.ROUND)
    assert record.changed is RecordChange.STATE, "a round changes the job's state"
    assert data.state.lost_seconds == {"recovery": 1.235} and data.goodput == 0.9877
    stored = JobRecordData.model_validate_json(data.model_dump_json())
    again = JobRecord.resumed(stored, clock)
    again.event(EventKind.FAILURE, "a worker on b failed")
    assert again.changed
    assert [e.kind for e in again.data(JobState(), 1.0).events] == [
        EventKind.STARTED,
        EventKind.FAILURE,
    ]
