"""A job's record in the cluster: its ConfigMap, when it is written, and how a restarted
operator carries it on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from kubernetes.client.exceptions import ApiException

from elasticjob.driver.driver import ElasticDriver
from elasticjob.driver.job_record import EventKind, JobRecordData
from elasticjob.driver.job_state import JobState
from elasticjob.driver.journal import JobJournal
from elasticjob.driver.record_saving import SAMPLES_SAVE_INTERVAL_S, SAVE_INTERVAL_S, RecordSaver
from elasticjob.operator.job_records import RecordKeeper, parse_record, record_config_map
from elasticjob.operator.kube import KubeApi
from tests.support.clock import FakeClock

JOB = {"metadata": {"name": "train", "uid": "uid-1"}}


class StubDriver:
    """What the record keeper asks of a driver: its record, kept by its journal."""

    def __init__(self, clock: FakeClock) -> None:
        self.journal = JobJournal(clock)
        self.round = 3
        self.slots: dict[object, object] = {object(): None, object(): None}
        self.clock = clock

    def start_record(self, job: str, wall_clock: Callable[[], float], started: str) -> None:
        self.journal.start_record(job, wall_clock, started)

    def resume_record(self, data: JobRecordData, wall_clock: Callable[[], float]) -> None:
        self.journal.resume_record(data, wall_clock)

    def scaled(self, old: int, new: int) -> None:
        self.journal.scaled(old, new, self.round, len(self.slots))

    def job_state(self) -> JobState:
        return JobState(resets=2)


class FakeApi:
    def __init__(self) -> None:
        self.maps: dict[str, dict[str, Any]] = {}
        self.writes = 0
        self.down = False

    async def read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.maps.get(name)

    async def apply_config_map(self, namespace: str, config_map: dict[str, Any]) -> None:
        if self.down:
            raise ApiException(status=503, reason="Service Unavailable")
        self.writes += 1
        self.maps[config_map["metadata"]["name"]] = config_map


def keeper(api: FakeApi, clock: FakeClock) -> RecordKeeper:
    return RecordKeeper(cast(KubeApi, api), "ns", "ns.train", clock)


async def attached(
    api: FakeApi, clock: FakeClock
) -> tuple[RecordKeeper, ElasticDriver, RecordSaver]:
    """A keeper, a driver it gave the job's record (the stored one, else a new one), and
    what saves the record."""
    records = keeper(api, clock)
    stub = cast(ElasticDriver, StubDriver(clock))
    saver = records.attach(JOB, stub, await records.load(JOB), clock)
    return records, stub, saver


async def test_the_record_is_written_when_changed_at_most_every_interval() -> None:
    api, clock = FakeApi(), FakeClock(500.0)
    records, stub, saver = await attached(api, clock)
    records.note_replicas(stub, 4)
    await saver.save_if_due()
    assert api.writes == 1
    records.note_replicas(stub, 6)
    await saver.save_if_due()
    assert api.writes == 1, "too soon"
    clock.now += SAVE_INTERVAL_S
    await saver.save_if_due()
    await saver.save_now()
    assert api.writes == 2, "nothing changed since"
    config_map = api.maps["train-record"]
    assert config_map["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    data = parse_record(config_map)
    assert [(e.kind, e.message) for e in data.events] == [
        (EventKind.STARTED, "job ns.train created"),
        (EventKind.SCALE, "replicas 4 -> 6"),
    ]
    assert data.events[1].world_size == 2 and data.events[1].round == 3
    assert data.state == JobState(resets=2), "the driver's state, with the events"


async def test_progress_samples_alone_are_saved_less_often_than_events() -> None:
    api, clock = FakeApi(), FakeClock(500.0)
    _, stub, saver = await attached(api, clock)
    await saver.save_if_due()
    for _ in range(int(SAMPLES_SAVE_INTERVAL_S) - 1):
        clock.now += 1.0
        stub.journal.record.sample(2, 100.0)
        await saver.save_if_due()
    assert api.writes == 1, "samples alone wait for their interval"
    clock.now += 1.0
    await saver.save_if_due()
    assert api.writes == 2
    samples = parse_record(api.maps["train-record"]).samples
    assert len(samples) == int(SAMPLES_SAVE_INTERVAL_S) - 1


async def test_a_restarted_operator_carries_the_stored_record_on() -> None:
    api, clock = FakeApi(), FakeClock(500.0)
    first = StubDriver(clock)
    first.journal.record.event(EventKind.FAILURE, "a worker on b failed")
    api.maps["train-record"] = record_config_map(JOB, first.journal.record.data(JobState(), 1.0))
    records = keeper(api, clock)
    second = StubDriver(clock)
    records.attach(JOB, cast(ElasticDriver, second), await records.load(JOB), clock)
    kinds = [e.kind for e in second.journal.record.events]
    assert kinds == [EventKind.FAILURE], "no second start"


async def test_an_unreadable_record_starts_a_new_one_and_a_failed_write_is_retried() -> None:
    api, clock = FakeApi(), FakeClock(500.0)
    api.maps["train-record"] = {"data": {"record.json": "{broken"}}
    records = keeper(api, clock)
    driver = StubDriver(clock)
    stub = cast(ElasticDriver, driver)
    saver = records.attach(JOB, stub, await records.load(JOB), clock)
    assert [e.kind for e in driver.journal.record.data(JobState(), 1.0).events] == [
        EventKind.STARTED
    ]
    driver.journal.record.event(EventKind.ROUND, round=1, world_size=2)
    api.down = True
    await saver.save_now()
    api.down = False
    clock.now += SAVE_INTERVAL_S
    await saver.save_if_due()
    assert api.writes == 1
    assert [e.kind for e in parse_record(api.maps["train-record"]).events][-1] is EventKind.ROUND
