"""The Kubernetes events of a job: each fact the journal records makes the event the story's
table says (pushed as it is recorded, never found by diffing)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from elasticjob.driver.job_record import EventKind, RecordChange, RecordEvent
from elasticjob.driver.journal import JobJournal
from elasticjob.driver.journal_events import HealthChecked, RecordChanged
from elasticjob.operator.api import BlacklistScope
from elasticjob.operator.job_events import JobEvents
from elasticjob.operator.job_story import TOLD, JobEvent
from elasticjob.wire.messages import CheckpointReport, ProgressRequest
from tests.support.clock import FakeClock

NODE, POD = BlacklistScope.NODE, BlacklistScope.POD
T = 1_795_000_000.0  # 2026-11-18T11:06:40Z
CHECKPOINT = CheckpointReport(name="ckpt-40", epoch=1, step=40, seconds=2.0, size_bytes=1024)


def restored(last_step: int | None, *, resumed: bool = False) -> Callable[[JobJournal], None]:
    """Round 4's rank 0 loaded ``CHECKPOINT``, the newest commit rank 0 reported being at
    ``last_step`` (None: none reported); ``resumed``: after a suspension."""

    def carry_out(journal: JobJournal) -> None:
        if resumed:
            journal.resuming()
        journal.committed_step = last_step
        progress = ProgressRequest(round=4, epoch=1, step=0, restored_from=CHECKPOINT)
        journal.progress(progress, 4, 2)

    return carry_out


@pytest.mark.parametrize(
    ("fact", "scope", "made"),
    [
        pytest.param(
            lambda j: j.published(3, 2, 2, 0, 0.0),
            NODE,
            JobEvent("RoundFormed", "round 3 formed: 2 workers (2 joined, 0 left)"),
            id="round",
        ),
        pytest.param(
            restored(47),
            NODE,
            JobEvent(
                "RestoredFromCheckpoint",
                "round 4 restored from checkpoint ckpt-40 at step 40: 7 committed steps trained "
                "again (no survivor)",
                warning=True,
            ),
            id="fallback",
        ),
        pytest.param(
            restored(None),
            NODE,
            JobEvent(
                "RestoredFromCheckpoint",
                "round 4 restored from checkpoint ckpt-40 at step 40: an unknown number of "
                "committed steps trained again (no survivor)",
                warning=True,
            ),
            id="fallback-steps-unknown",
        ),
        pytest.param(
            restored(40, resumed=True),
            NODE,
            JobEvent(
                "RestoredFromCheckpoint",
                "round 4 restored from checkpoint ckpt-40 at step 40: 0 committed steps "
                "trained again (the job resumed after a suspension)",
            ),
            id="resumed-nothing-lost",
        ),
        pytest.param(
            lambda j: j.blacklisted("n1", 10.0, 2),
            NODE,
            JobEvent(
                "NodeBlacklisted", "blacklisted n1 for 10 s, until 2026-11-18T11:06:50Z", True
            ),
            id="node",
        ),
        pytest.param(
            lambda j: j.blacklisted("p-a", 10.0, 2),
            POD,
            JobEvent(
                "PodBlacklisted", "blacklisted p-a for 10 s, until 2026-11-18T11:06:50Z", True
            ),
            id="pod",
        ),
        pytest.param(
            lambda j: j.straggler("p-b", 1, 2.5, 3),
            NODE,
            JobEvent(
                "StragglerDetected",
                "straggler: rank 1 on p-b: its steps keep it busy 2.50x as long as the other "
                "workers'",
                True,
            ),
            id="straggler",
        ),
        pytest.param(
            lambda j: j.health_checked(HealthChecked("p-c", "n3", True, "compute 0.9x", 4.0), 2),
            NODE,
            JobEvent(
                "HealthCheckPassed",
                "pod p-c on node n3 passed its health check in 4.0 s: compute 0.9x",
            ),
            id="health-check-passed",
        ),
        pytest.param(
            lambda j: j.health_checked(
                HealthChecked("p-c", "n3", False, "compute 0.05x of its peers' median", 9.0), 2
            ),
            NODE,
            JobEvent(
                "HealthCheckFailed",
                "pod p-c on node n3 failed its health check in 9.0 s: compute 0.05x of its "
                "peers' median; it is not admitted",
                warning=True,
            ),
            id="health-check-failed",
        ),
        pytest.param(
            lambda j: j.health_checked(
                HealthChecked("p-c", None, False, "no verdict within 300 s", None), 2
            ),
            NODE,
            JobEvent(
                "HealthCheckFailed",
                "pod p-c failed its health check: no verdict within 300 s; it is not admitted",
                warning=True,
            ),
            id="health-check-no-verdict",
        ),
        pytest.param(
            lambda j: j.noted(
                EventKind.WORKER_FAILED, "p-b on n2: OOMKilled", host="p-b", warning=True
            ),
            NODE,
            JobEvent("WorkerFailed", "pod p-b on n2: OOMKilled", True),
            id="worker-failed",
        ),
        pytest.param(
            lambda j: j.noted(EventKind.LEAVING, "p-c leaves the job", host="p-c", warning=False),
            NODE,
            JobEvent("ScalingIn", "pod p-c leaves the job"),
            id="leaving",
        ),
        pytest.param(
            lambda j: j.noted(
                EventKind.CLAMPED, "replicas 9 is above maxReplicas 4", host="", warning=True
            ),
            NODE,
            JobEvent(
                "ReplicasClamped", "replicas clamped: replicas 9 is above maxReplicas 4", True
            ),
            id="clamped",
        ),
        pytest.param(lambda j: j.scaled(3, 5, 2, 3), NODE, None, id="scale-request-no-event"),
        pytest.param(lambda j: j.failed("p-b", 2, 3), NODE, None, id="round-failed-no-event"),
    ],
)
def test_each_recorded_fact_makes_the_event_the_table_says(
    fact: Callable[[JobJournal], None], scope: BlacklistScope, made: JobEvent | None
) -> None:
    journal = JobJournal(FakeClock(0.0))
    journal.start_record("ns.train", lambda: T, "job ns.train created")
    events = JobEvents(scope, lambda: None)
    journal.subscribe(events.on_journal)
    fact(journal)
    assert events.take() == ([] if made is None else [made])


def test_every_kind_of_record_event_has_a_row_and_each_event_something_to_say() -> None:
    assert set(TOLD) == set(EventKind)
    for kind, told in TOLD.items():
        assert told.reason is None or told.message or told.line, kind


def test_queued_events_wake_the_controller_and_are_taken_once_in_order() -> None:
    woken: list[bool] = []
    events = JobEvents(NODE, lambda: woken.append(True))
    events.told(RecordEvent(t=T, kind=EventKind.LEAVING, message="p-c leaves", host="p-c"))
    events.on_journal(RecordChanged(RecordChange.EVENTS))
    events.told(RecordEvent(t=T, kind=EventKind.ROUND, round=2, world_size=1))
    events.told(RecordEvent(t=T, kind=EventKind.CHECKPOINT))
    assert len(woken) == 2, "a record change, or a checkpoint, makes no event"
    assert [e.reason for e in events.take()] == ["ScalingIn", "RoundFormed"]
    assert events.take() == []
