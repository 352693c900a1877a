"""The throughput the timeline draws: windows of training time that never span a pause, the
script's first measurement after a pause left out, the training a rollback threw away marked."""

from __future__ import annotations

from typing import NamedTuple

import pytest

from elasticjob.driver.job_record import EventKind, JobRecordData, RecordEvent, RecordSample
from elasticjob.job_throughput import MIN_WINDOW_S, WINDOWS, throughput, window_length
from elasticjob.job_timeline import pauses

T0 = 1_790_000_000.0
WINDOW_S = 10.0


def at(t: float, kind: EventKind, rolled_back_from: float | None = None) -> RecordEvent:
    return RecordEvent(
        t=T0 + t,
        kind=kind,
        rolled_back_from=None if rolled_back_from is None else T0 + rolled_back_from,
    )


def rates(*points: tuple[float, float]) -> tuple[RecordSample, ...]:
    return tuple(RecordSample(t=T0 + t, world_size=4, samples_per_second=r) for t, r in points)


STARTED = (at(0, EventKind.STARTED), at(10, EventKind.RESUMED))
"""A job that started and trained from 10 s on."""
STEADY = rates((12, 900), (15, 1000), (20, 1000), (25, 1000), (30, 1000))
"""Reports every 5 s (the first, at 12 s, the script's first measurement)."""


class Case(NamedTuple):
    events: tuple[RecordEvent, ...]
    samples: tuple[RecordSample, ...]
    windows: list[tuple[float, float, float, bool]]
    """(start, end, samples/s, kept), seconds after T0."""


CASES = {
    "steady": Case(STARTED, STEADY, [(10, 20, 1000, True), (20, 30, 1000, True)]),
    "unequal intervals are weighted by time": Case(
        STARTED,
        rates((12, 900), (18, 1000), (24, 2000)),
        [(10, 20, (6 * 1000 + 2 * 2000) / 8, True), (20, 24, 2000, True)],
    ),
    "failure: the pause splits the windows, the spike after it is left out": Case(
        (
            *STARTED,
            at(32, EventKind.FAILURE),
            at(34, EventKind.ROUND),
            at(40, EventKind.RESUMED),
        ),
        STEADY + rates((34, 1000), (45, 7000), (50, 1500), (55, 1500), (60, 1500), (63, 1500)),
        [
            (10, 20, 1000, True),
            (20, 30, 1000, True),
            (40, 50, 1500, True),
            (50, 60, 1500, True),
            (60, 63, 1500, True),
        ],
    ),
    "the rate re-sent after a resume stands, the first new one is left out": Case(
        (*STARTED, at(32, EventKind.FAILURE), at(40, EventKind.RESUMED)),
        STEADY + rates((42, 1000), (45, 7000), (50, 1500)),
        [
            (10, 20, 1000, True),
            (20, 30, 1000, True),
            (40, 50, (2 * 1000 + 5 * 1500) / 7, True),
        ],
    ),
    "rollback: the thrown-away training is marked, its replay counts": Case(
        (*STARTED, at(32, EventKind.FAILURE), at(40, EventKind.RESUMED, rolled_back_from=25)),
        STEADY + rates((31, 1000), (42, 800), (50, 1200), (60, 1200)),
        [
            (10, 20, 1000, True),
            (20, 25, 1000, True),
            (25, 30, 1000, False),
            (30, 31, 1000, False),
            (40, 50, 1200, True),
            (50, 60, 1200, True),
        ],
    ),
    "durable fallback: reports in the pause count for nothing, fresh workers start at 0": Case(
        (
            *STARTED,
            at(21, EventKind.RESIZED),
            at(23, EventKind.RESUMED),
            at(32, EventKind.FAILURE),
            at(40, EventKind.RESUMED, rolled_back_from=15),
        ),
        rates(
            (12, 900),
            (15, 1000),
            (20, 1000),
            (22, 1000),
            (25, 1000),
            (30, 1000),
            (33, 0),
            (41, 0),
            (45, 700),
            (50, 800),
        ),
        [
            (10, 15, 1000, True),
            (15, 20, 1000, False),
            (23, 30, 1000, False),
            (40, 50, 800, True),
        ],
    ),
    "resize: no window spans the pause": Case(
        (*STARTED, at(30, EventKind.RESIZED), at(35, EventKind.RESUMED)),
        STEADY[:-1] + rates((32, 1000), (38, 1900), (40, 2000), (45, 2000)),
        [(10, 20, 1000, True), (20, 25, 1000, True), (35, 45, 2000, True)],
    ),
    "suspension: nothing until the resumed run measures": Case(
        (
            *STARTED,
            at(31, EventKind.SUSPENDED),
            at(100, EventKind.STARTED),
            at(110, EventKind.RESUMED),
        ),
        STEADY + rates((31, 0), (111, 0), (115, 950), (120, 1100)),
        [(10, 20, 1000, True), (20, 30, 1000, True), (110, 120, 1100, True)],
    ),
    "a record carried on without its start: windows from the first rate covered": Case(
        (at(0, EventKind.ADOPTED),),
        rates((3, 900), (6, 1000), (16, 2000)),
        [(3, 13, (3 * 1000 + 7 * 2000) / 10, True), (13, 16, 2000, True)],
    ),
    "still paused at the end: nothing after the failure": Case(
        (*STARTED, at(32, EventKind.FAILURE)),
        STEADY + rates((40, 5000)),
        [(10, 20, 1000, True), (20, 30, 1000, True)],
    ),
    "empty record": Case((), (), []),
    "a single sample": Case(STARTED, rates((12, 900)), []),
    "no rate reported: 0 is no figure": Case(STARTED, rates((12, 0), (15, 0), (20, 0)), []),
    "out-of-order samples are put in time order": Case(
        STARTED, STEADY[3:] + STEADY[:3], [(10, 20, 1000, True), (20, 30, 1000, True)]
    ),
    "duplicate samples: the one recorded last counts": Case(
        STARTED,
        STEADY + rates((30, 3000), (35, 1000)),
        [(10, 20, 1000, True), (20, 30, 2000, True), (30, 35, 1000, True)],
    ),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_throughput_windows(case: Case) -> None:
    record = JobRecordData(
        job="ns.train", events=case.events, samples=case.samples, written_at=T0 + 200
    )
    spans = [(start, stop) for start, stop, _ in pauses(record)]
    windows = throughput(record, spans, WINDOW_S)
    got = [(w.start - T0, w.end - T0, w.samples_per_second, w.kept) for w in windows]
    assert got == [pytest.approx(row) for row in case.windows]


def test_the_window_length_follows_the_job() -> None:
    assert window_length(3600.0) == 3600.0 / WINDOWS
    assert window_length(10.0) == MIN_WINDOW_S
    with pytest.raises(ValueError, match="some time"):
        throughput(JobRecordData(job="ns.train"), [], 0.0)
