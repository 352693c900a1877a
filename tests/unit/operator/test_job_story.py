"""The job's story in ``status.history``: which record events tell it, and how each reads
(their Kubernetes events: ``test_job_events.py``)."""

from __future__ import annotations

import pytest

from elasticjob.driver.job_record import EventKind, RecordEvent
from elasticjob.operator.job_story import history_of

T = 1_795_000_000.0  # 2026-11-18T11:06:40Z
AT = "2026-11-18T11:06:40Z"


def event(kind: EventKind, message: str = "", **fields: object) -> RecordEvent:
    return RecordEvent.model_validate({"t": T, "kind": kind, "message": message, **fields})


@pytest.mark.parametrize(
    ("recorded", "line"),
    [
        pytest.param(event(EventKind.STARTED, "job ns.a started"), "job ns.a started", id="start"),
        pytest.param(
            event(EventKind.ROUND, "3 joined, 0 left", round=1, world_size=3),
            "round 1 formed: 3 workers (3 joined, 0 left)",
            id="round",
        ),
        pytest.param(
            event(EventKind.FAILURE, "worker p-b[0] failed (exit 137)", round=2),
            "round 2 failed: worker p-b[0] failed (exit 137)",
            id="failure",
        ),
        pytest.param(
            event(EventKind.BLACKLISTED, "node-2 for 300 s", round=2, until=T + 300),
            "blacklisted node-2 for 300 s, until 2026-11-18T11:11:40Z",
            id="blacklisted-until",
        ),
        pytest.param(
            event(EventKind.RESUMED, "recovered in 0.84 s", round=3),
            "round 3: training resumed, recovered in 0.84 s",
            id="recovery-time",
        ),
        pytest.param(
            event(EventKind.RESUMED, round=4), "round 4: training resumed", id="after-a-resize"
        ),
        pytest.param(
            event(EventKind.SCALE, "replicas 3 -> 5"), "scale request: replicas 3 -> 5", id="scale"
        ),
        pytest.param(
            event(EventKind.RESTORED, "step-40 at step 40: 7 steps trained again", round=5),
            "round 5 restored from checkpoint step-40 at step 40: 7 steps trained again",
            id="fallback",
        ),
        pytest.param(
            event(EventKind.SUSPENDED, "saved at step 80"),
            "suspended: saved at step 80",
            id="suspended",
        ),
        pytest.param(
            event(EventKind.STRAGGLER, "rank 2 on p-c: steps 2.10x the others'"),
            "straggler: rank 2 on p-c: steps 2.10x the others'",
            id="straggler",
        ),
        pytest.param(
            event(
                EventKind.HEALTH_CHECK_FAILED, "p-d on node node-3 failed its health check: 0.08x"
            ),
            "not admitted: p-d on node node-3 failed its health check: 0.08x",
            id="health-check",
        ),
        pytest.param(
            event(EventKind.ADOPTED, "an operator took the running round over", round=6),
            "round 6: an operator took the running round over",
            id="handover",
        ),
        pytest.param(event(EventKind.FINISHED, "succeeded"), "job succeeded", id="end"),
        pytest.param(event(EventKind.CHECKPOINT, "step-40"), None, id="checkpoints-are-left-out"),
        pytest.param(event(EventKind.RESIZED, round=3), None, id="round-ends-are-left-out"),
        pytest.param(
            event(EventKind.CLAMPED, "replicas 9 is above maxReplicas 4"),
            "replicas clamped: replicas 9 is above maxReplicas 4",
            id="clamped",
        ),
        pytest.param(
            event(EventKind.CREATE_REFUSED, "exceeded quota: q"),
            "pods not created: exceeded quota: q",
            id="create-refused",
        ),
        pytest.param(
            event(EventKind.WORKER_FAILED, "p-b on n2: OOMKilled", host="p-b"),
            None,
            id="a-worker-failure-is-its-round's",
        ),
        pytest.param(event(EventKind.LEAVING, "p-c leaves"), None, id="leaving-is-an-event"),
        pytest.param(
            event(EventKind.HEALTH_CHECK_PASSED, "p-c passed"), None, id="passing-is-an-event"
        ),
    ],
)
def test_each_event_of_the_story_reads_as_a_line_stamped_with_its_time(
    recorded: RecordEvent, line: str | None
) -> None:
    assert history_of([recorded]) == ([] if line is None else [f"{AT} {line}"])


def test_the_story_keeps_the_newest_lines_oldest_first() -> None:
    events = [
        event(EventKind.ROUND, "", round=n, world_size=2).model_copy(update={"t": T + n})
        for n in range(1, 31)
    ]
    lines = history_of(events, kept=20)
    assert len(lines) == 20
    assert "round 11 formed" in lines[0] and "round 30 formed" in lines[-1]
