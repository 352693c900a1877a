"""What a replica does when it comes to lead and when it stands down: its rendezvous service,
its job supervisor and the leader label on the operator pods (on a recording API)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, cast

from elasticjob.operator.api import LABEL_OPERATOR_LEADER
from elasticjob.operator.kube import KubeApi, PodList
from elasticjob.operator.leadership import OperatorLeadership
from elasticjob.operator.supervisor import JobSupervisor, StopSignal
from elasticjob.rendezvous.server import RendezvousService

DEADLINE_S = 5.0


class Labels:
    """The operator pods' leader labels as the API server has them, the label changes the
    replica asks for (pod, value; None: taken off), and the jobs a list finds."""

    def __init__(self, labelled: set[str], jobs: list[dict[str, Any]]) -> None:
        self.labelled = labelled
        self.jobs = jobs
        self.changes: list[tuple[str, str | None]] = []

    async def label_pod(
        self, namespace: str, name: str, labels: dict[str, str | None], timeout_s: float
    ) -> None:
        assert namespace == "system"
        value = labels[LABEL_OPERATOR_LEADER]
        self.changes.append((name, value))
        (self.labelled.add if value else self.labelled.discard)(name)

    async def list_pods(self, namespace: str, selector: str) -> PodList:
        assert (namespace, selector) == ("system", f"{LABEL_OPERATOR_LEADER}=true")
        return PodList([{"metadata": {"name": name}} for name in sorted(self.labelled)], "1")

    async def list_jobs(self, namespaces: tuple[str, ...]) -> list[dict[str, Any]]:
        return self.jobs


async def run_until_stopped(
    namespace: str, name: str, body: Mapping[str, Any], stopped: StopSignal
) -> None:
    await stopped.wait()


def job(uid: str) -> dict[str, Any]:
    return {"metadata": {"uid": uid, "namespace": "ns", "name": uid}, "spec": {}, "status": {}}


async def test_leading_serves_runs_and_routes_here_and_standing_down_undoes_it() -> None:
    unseen = job("unseen")  # listed, though the watch has not shown it yet
    labels, service = Labels({"op-a", "op-b", "op-c"}, [unseen]), RendezvousService()
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
    await replica.lead()
    assert not service.standing_by and jobs.leading and told == [True]
    assert service.adopting(), "the job it saw gets 503 until its controller serves it"
    await asyncio.wait_for(_until(lambda: labels.labelled == {"op-b"}), DEADLINE_S)
    assert ("op-b", "true") in labels.changes, "every other pod's label taken off"
    service.add_job("ns.train", "the-key", cast(Any, None))
    assert service.adopting(), "the listed job is expected back too"
    labels.changes.clear()
    await asyncio.wait_for(replica.stand_down(lost=False), DEADLINE_S)
    assert service.standing_by and not jobs.leading and told == [True, False]
    assert labels.changes == [("op-b", None)]
    await jobs.stop_all()


async def _until(check: Any) -> None:
    while not check():
        await asyncio.sleep(0.01)


async def test_the_leader_puts_the_route_right_when_someone_changes_the_labels() -> None:
    """Its label taken off its pod and put on another by hand: within a check, the label is
    on its pod again and on no other; a standby checks nothing."""
    labels, service = Labels(set(), []), RendezvousService()
    jobs = JobSupervisor(run_until_stopped, leading=False)
    replica = OperatorLeadership(
        lambda: cast(KubeApi, labels),
        lambda: service,
        jobs,
        ("system", "op-b"),
        route_check_s=0.01,
    )
    await replica.lead()
    await asyncio.wait_for(_until(lambda: labels.labelled == {"op-b"}), DEADLINE_S)
    labels.labelled.clear()
    labels.labelled.add("op-c")
    await asyncio.wait_for(_until(lambda: labels.labelled == {"op-b"}), DEADLINE_S)
    await asyncio.wait_for(replica.stand_down(lost=False), DEADLINE_S)
    labels.labelled.add("op-c")
    labels.changes.clear()
    await asyncio.sleep(0.05)  # several checks' worth: none runs once it stood down
    assert labels.changes == [] and labels.labelled == {"op-c"}
    await jobs.stop_all()
