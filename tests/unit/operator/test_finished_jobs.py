"""A finished job's deletion after ``ttlSecondsAfterFinished`` (``finished_jobs``): when it is
due, by table; its timer kept by the leader alone, moved by a changed ttl, dropped with the job."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import pytest

from elasticjob.operator.finished_jobs import FinishedJobs, deletion_due
from elasticjob.operator.supervisor import JobSupervisor, StopSignal

DEADLINE = 5.0
DONE_AT = "2026-12-01T10:00:00Z"
DONE_S = datetime.datetime(2026, 12, 1, 10, tzinfo=datetime.UTC).timestamp()


def job(
    phase: str | None = "Succeeded",
    ttl: int | None = 60,
    completed: str | None = DONE_AT,
    uid: str = "u1",
) -> dict[str, Any]:
    spec: dict[str, Any] = {"replicas": 1}
    if ttl is not None:
        spec["ttlSecondsAfterFinished"] = ttl
    status: dict[str, Any] = {"phase": phase}
    if completed is not None:
        status["completionTime"] = completed
    metadata = {"uid": uid, "namespace": "ns", "name": f"job-{uid}"}
    return {"metadata": metadata, "spec": spec, "status": status}


@pytest.mark.parametrize(
    ("body", "due"),
    [
        pytest.param(job(), DONE_S + 60, id="succeeded"),
        pytest.param(job(phase="Failed", ttl=0), DONE_S, id="failed-ttl-0"),
        pytest.param(job(ttl=None), None, id="no-ttl"),
        pytest.param(job(phase="Running"), None, id="running"),
        pytest.param(job(phase="Suspended"), None, id="suspended-has-not-finished"),
        pytest.param(job(completed=None), None, id="no-completion-time-yet"),
    ],
)
def test_deletion_due(body: dict[str, Any], due: float | None) -> None:
    assert deletion_due(body) == due


class Deletions:
    def __init__(self) -> None:
        self.deleted: list[tuple[str, str, str]] = []
        self.changed = asyncio.Event()

    async def __call__(self, namespace: str, name: str, uid: str) -> None:
        self.deleted.append((namespace, name, uid))
        self.changed.set()


async def test_a_job_past_its_ttl_is_deleted_at_once_and_one_within_it_waits() -> None:
    deletions = Deletions()
    now = [DONE_S + 30]
    finished = FinishedJobs(deletions, lambda: now[0])
    finished.observe(job(uid="late", ttl=10))
    finished.observe(job(uid="early", ttl=3600))
    await asyncio.wait_for(deletions.changed.wait(), DEADLINE)
    assert deletions.deleted == [("ns", "job-late", "late")]
    assert finished.due == {"early": DONE_S + 3600}
    await finished.stop()
    assert finished.due == {}


async def test_a_ttl_changed_after_the_end_moves_the_timer_and_a_removed_one_stops_it() -> None:
    deletions = Deletions()
    finished = FinishedJobs(deletions, lambda: DONE_S)
    finished.observe(job(ttl=3600))
    finished.observe(job(ttl=7200))
    assert finished.due == {"u1": DONE_S + 7200}
    finished.observe(job(ttl=None))
    assert finished.due == {}
    finished.observe(job(ttl=0))
    await asyncio.wait_for(deletions.changed.wait(), DEADLINE)
    assert deletions.deleted == [("ns", "job-u1", "u1")]


async def until_stopped(namespace: str, name: str, body: Any, stopped: StopSignal) -> None:
    del namespace, name, body
    await stopped.wait()


async def test_only_the_leader_keeps_timers_and_a_deleted_job_loses_its_own() -> None:
    finished = FinishedJobs(Deletions(), lambda: DONE_S)
    supervisor = JobSupervisor(until_stopped, leading=False, finished=finished)
    await supervisor.observe(None, job(ttl=3600))
    assert finished.due == {}, "a standby deletes nothing"
    supervisor.lead()
    assert finished.due == {"u1": DONE_S + 3600}, "the new leader finds the finished job"
    await supervisor.observe("DELETED", job(ttl=3600))
    assert finished.due == {}
    await supervisor.observe(None, job(uid="u2", ttl=3600))
    assert finished.due == {"u2": DONE_S + 3600}
    await supervisor.stand_down()
    assert finished.due == {}, "the next leader has the timers"
    await supervisor.stop_all()
