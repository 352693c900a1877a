"""What a replica does when it comes to lead and when it stands down: its rendezvous service,
its job supervisor and the leader label on the operator pods (on a recording API)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, cast

from elasticjob.operator.api import LABEL_OPERATOR_LEADER
from elasticjob.operator.kube import KubeApi
from elasticjob.operator.leadership import OperatorLeadership
from elasticjob.operator.supervisor import JobSupervisor, StopSignal
from elasticjob.rendezvous.server import RendezvousService

DEADLINE_S = 5.0


class Labels:
    """The label changes the replica asks for: (pod, value; None: taken off)."""

    def __init__(self) -> None:
        self.changes: list[tuple[str, str | None]] = []

    async def label_pod(
        self, namespace: str, name: str, labels: dict[str, str | None], timeout_s: float
    ) -> None:
        assert namespace == "system"
        self.changes.append((name, labels[LABEL_OPERATOR_LEADER]))


async def run_until_stopped(
    namespace: str, name: str, body: Mapping[str, Any], stopped: StopSignal
) -> None:
    await stopped.wait()


def job(uid: str) -> dict[str, Any]:
    return {"metadata": {"uid": uid, "namespace": "ns", "name": uid}, "spec": {}, "status": {}}


async def test_leading_serves_runs_and_routes_here_and_standing_down_undoes_it() -> None:
    labels, service = Labels(), RendezvousService()
    jobs = JobSupervisor(run_until_stopped, leading=False)
    told: list[bool] = []
    replica = OperatorLeadership(
        lambda: cast(KubeApi, labels),
        lambda: service,
        jobs,
        ("system", "op-b"),
        on_change=told.append,
    )
    await replica.start_standing_by()
    assert service.standing_by and labels.changes == [("op-b", None)]
    await jobs.observe(None, job("train"))
    labels.changes.clear()
    await replica.lead("op-a_1f2e3d4c")
    assert not service.standing_by and jobs.leading and told == [True]
    assert service.adopting(), "the job it saw gets 503 until its controller serves it"
    await asyncio.wait_for(_until(lambda: len(labels.changes) == 2), DEADLINE_S)
    assert sorted(labels.changes, key=str) == [("op-a", None), ("op-b", "true")]
    labels.changes.clear()
    await asyncio.wait_for(replica.stand_down(lost=False), DEADLINE_S)
    assert service.standing_by and not jobs.leading and told == [True, False]
    assert labels.changes == [("op-b", None)]
    await jobs.stop_all()


async def _until(check: Any) -> None:
    while not check():
        await asyncio.sleep(0.01)
