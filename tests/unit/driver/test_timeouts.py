"""Table tests of whom the driver stops for taking too long (``elasticjob.driver.timeouts``)."""

from __future__ import annotations

import math

import pytest

from elasticjob.driver.driver_types import Departure
from elasticjob.driver.timeouts import (
    overdue_dismissals,
    overdue_endings,
    past_active_deadline,
    slow_starters,
)
from elasticjob.driver.worker_record import WorkerRecord
from elasticjob.wire.messages import WorkerId

C0 = WorkerId("c", 0)
LEAVING, DISMISSED, FAILED = Departure.LEAVING, Departure.DISMISSED, Departure.FAILED


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        pytest.param(WorkerRecord(started_at=0.0), True, id="never-registered"),
        pytest.param(WorkerRecord(started_at=50.0), False, id="within-timeout"),
        pytest.param(WorkerRecord(started_at=0.0, waiting_after=0), False, id="registered"),
        pytest.param(WorkerRecord(started_at=0.0, running=False), False, id="ended"),
        pytest.param(WorkerRecord(started_at=0.0, departure=FAILED), False, id="already-failed"),
        pytest.param(WorkerRecord(started_at=0.0, last_round=2), False, id="member-before"),
    ],
)
def test_slow_starters(record: WorkerRecord, expected: bool) -> None:
    assert slow_starters({C0: record}, now=100.0, start_timeout_s=60.0) == (
        (C0,) if expected else ()
    )


def dismissed(at: float | None, **fields: bool) -> WorkerRecord:
    return WorkerRecord(started_at=0.0, departure=DISMISSED, dismissed_at=at, **fields)


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        pytest.param(dismissed(70.0), True, id="grace-over"),
        pytest.param(dismissed(80.0), False, id="within-grace"),
        pytest.param(dismissed(0.0, running=False), False, id="exited"),
        pytest.param(dismissed(0.0, stop_requested=True), False, id="stopping"),
        pytest.param(WorkerRecord(started_at=0.0, departure=LEAVING), False, id="leaving"),
    ],
)
def test_overdue_dismissals(record: WorkerRecord, expected: bool) -> None:
    assert overdue_dismissals({C0: record}, now=100.0, grace_s=30.0) == ((C0,) if expected else ())


def ending(since: float | None, **fields: object) -> WorkerRecord:
    """A member of round 1 that reported how its process ends at ``since`` (None: reported
    nothing; which state it reported is the rendezvous's to keep, and does not matter here)
    and beat last at 0."""
    record = WorkerRecord(started_at=0.0, last_round=1, ending_since=since, last_heartbeat=0.0)
    for name, value in fields.items():
        setattr(record, name, value)
    return record


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        pytest.param(ending(70.0), True, id="grace-over"),
        pytest.param(ending(80.0), False, id="within-grace"),
        pytest.param(ending(0.0, last_heartbeat=80.0), False, id="still-beating"),
        pytest.param(ending(0.0, last_heartbeat=70.0), True, id="stopped-beating"),
        pytest.param(ending(0.0, last_heartbeat=None), False, id="never-beat"),
        pytest.param(ending(None), False, id="reported-nothing"),
        pytest.param(ending(0.0, running=False), False, id="exited"),
        pytest.param(ending(0.0, stop_requested=True), False, id="stopping"),
        pytest.param(ending(0.0, departure=DISMISSED), False, id="dismissed"),
        pytest.param(ending(0.0, departure=FAILED), False, id="already-failed"),
    ],
)
def test_overdue_endings(record: WorkerRecord, expected: bool) -> None:
    found = overdue_endings({C0: record}, now=100.0, grace_s=30.0, heartbeat_timeout_s=5.0)
    assert found == ((C0,) if expected else ())


@pytest.mark.parametrize(
    ("timeout_s", "counts_from", "expected"),
    [
        pytest.param(5.0, -math.inf, True, id="judged"),
        pytest.param(None, -math.inf, False, id="no-heartbeat-timeout"),
        pytest.param(5.0, None, False, id="driver-unreachable"),
        pytest.param(5.0, 75.0, False, id="silence-counts-from-later"),
        pytest.param(5.0, 70.0, True, id="silence-counts-from-earlier"),
    ],
)
def test_overdue_endings_are_judged_as_evictions_are(
    timeout_s: float | None, counts_from: float | None, expected: bool
) -> None:
    """Without a heartbeat timeout workers beat rarely (orphan checks) or never, and while
    they cannot reach the driver their silence says nothing (``liveness.Reachability``)."""
    found = overdue_endings(
        {C0: ending(0.0)},
        now=100.0,
        grace_s=30.0,
        heartbeat_timeout_s=timeout_s,
        counts_from=counts_from,
    )
    assert found == ((C0,) if expected else ())


@pytest.mark.parametrize(
    ("running_s", "deadline_s", "past"),
    [
        pytest.param(99.0, 100.0, False, id="within"),
        pytest.param(100.0, 100.0, True, id="at-the-deadline"),
        pytest.param(250.0, 100.0, True, id="past"),
        pytest.param(1e9, None, False, id="no-deadline"),
    ],
)
def test_past_active_deadline(running_s: float, deadline_s: float | None, past: bool) -> None:
    message = past_active_deadline(running_s, deadline_s)
    assert (message is not None) is past
    if message is not None:
        assert f"active deadline of {deadline_s:.0f} s" in message, message
