"""The Kubernetes events a job's journal makes (pushed as they happen, not found by diffing)."""

from __future__ import annotations

import pytest

from elasticjob.driver.job_record import RecordChange
from elasticjob.driver.journal_events import (
    CheckpointRestored,
    HealthChecked,
    HostBlacklisted,
    JournalEvent,
    RecordChanged,
    Restore,
    RoundPublished,
)
from elasticjob.operator.api import BlacklistScope
from elasticjob.operator.job_events import JobEvent, JobEvents, event_of
from elasticjob.wire.messages import CheckpointReport

CHECKPOINT = CheckpointReport(name="step-40", epoch=1, step=40, seconds=0.5, size_bytes=10)
NODE, POD = BlacklistScope.NODE, BlacklistScope.POD


@pytest.mark.parametrize(
    ("event", "scope", "made"),
    [
        (
            RoundPublished(3, 2, ("p-a", "p-b")),
            NODE,
            JobEvent("RoundFormed", "round 3: 2 workers in p-a, p-b"),
        ),
        (
            CheckpointRestored(Restore(CHECKPOINT, 4, 7)),
            NODE,
            JobEvent(
                "RestoredFromCheckpoint",
                "no worker survived: round 4 resumed from checkpoint step-40 (step 40); 7 "
                "committed steps are trained again",
                warning=True,
            ),
        ),
        (
            CheckpointRestored(Restore(CHECKPOINT, 4, None)),
            NODE,
            JobEvent(
                "RestoredFromCheckpoint",
                "no worker survived: round 4 resumed from checkpoint step-40 (step 40); an "
                "unknown number of committed steps are trained again",
                warning=True,
            ),
        ),
        (
            CheckpointRestored(Restore(CHECKPOINT, 4, 0, resumed=True)),
            NODE,
            JobEvent(
                "RestoredFromCheckpoint",
                "resumed after a suspension: round 4 resumed from checkpoint step-40 (step 40); "
                "0 committed steps are trained again",
            ),
        ),
        (
            HostBlacklisted("n1", 10.0, 2),
            NODE,
            JobEvent("NodeBlacklisted", "node n1 blacklisted", True),
        ),
        (
            HostBlacklisted("p-a", 10.0, 2),
            POD,
            JobEvent("PodBlacklisted", "pod p-a blacklisted", True),
        ),
        (
            HealthChecked("p-c", "n3", True, "compute 1.02x, copy 0.98x", 4.25),
            NODE,
            JobEvent(
                "HealthCheckPassed",
                "pod p-c on node n3 passed its health check in 4.2 s: compute 1.02x, copy 0.98x",
            ),
        ),
        (
            HealthChecked("p-c", "n3", False, "compute 0.05x of its peers' median", 9.0),
            NODE,
            JobEvent(
                "HealthCheckFailed",
                "pod p-c on node n3 failed its health check in 9.0 s: compute 0.05x of its "
                "peers' median; it is not admitted",
                warning=True,
            ),
        ),
        (
            HealthChecked("p-c", None, False, "no verdict within 300 s", None),
            NODE,
            JobEvent(
                "HealthCheckFailed",
                "pod p-c failed its health check: no verdict within 300 s; it is not admitted",
                warning=True,
            ),
        ),
        (RecordChanged(RecordChange.SAMPLES), NODE, None),
    ],
)
def test_journal_events_make_kubernetes_events(
    event: JournalEvent, scope: BlacklistScope, made: JobEvent | None
) -> None:
    assert event_of(event, scope) == made


def test_queued_events_wake_the_controller_and_are_taken_once_in_order() -> None:
    woken: list[bool] = []
    events = JobEvents(NODE, lambda: woken.append(True))
    events.add("ScalingIn", "pod p-c leaves the job")
    events.on_journal(RecordChanged(RecordChange.EVENTS))
    events.on_journal(RoundPublished(2, 1, ("p-a",)))
    assert len(woken) == 2, "a record change makes no event"
    assert [e.reason for e in events.take()] == ["ScalingIn", "RoundFormed"]
    assert events.take() == []
