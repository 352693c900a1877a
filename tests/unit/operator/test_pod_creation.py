"""A job's controller creates the pods it lacks at once: every create is in flight before
the first answers, the pods created are merged even when another create fails, and that
failure is raised; a create refused for a quota is told once and tried again later."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from elasticjob.operator.api import ElasticJobSpec, parse_spec
from elasticjob.operator.controller import JobController
from elasticjob.operator.controller_settings import ControllerSettings
from elasticjob.operator.job_secret import JobSecret, PodCredentials
from elasticjob.operator.kube import KubeApi
from elasticjob.rendezvous.server import RendezvousService
from tests.support.crd_model import with_changes

DEADLINE = 5.0
JOB = {"metadata": {"name": "job", "namespace": "ns", "uid": "u1"}}


class SecretWrites:
    """The job's Secret takes every pod's credential."""

    async def fill_secret(
        self, namespace: str, name: str, data: dict[str, str | None], version: str | None
    ) -> bool:
        return True


class ConcurrentApi(SecretWrites, KubeApi):
    """Answers creates only once ``expected`` of them are in flight; ``refuse`` fails one."""

    def __init__(self, expected: int, refuse: int | None = None) -> None:
        super().__init__()
        self._expected, self._refuse = expected, refuse
        self.in_flight = 0
        self._all_in = asyncio.Event()

    async def create_pod(self, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
        self.in_flight += 1
        number = self.in_flight
        if self.in_flight == self._expected:
            self._all_in.set()
        await asyncio.wait_for(self._all_in.wait(), DEADLINE)
        if number == self._refuse:
            raise OSError("connection reset")
        meta = {**pod["metadata"], "name": f"job-worker-{number}", "uid": f"p{number}"}
        return {**pod, "metadata": meta, "status": {"phase": "Pending"}}


def controller(api: KubeApi, spec: ElasticJobSpec) -> JobController:
    job = JobController(
        "ns", "job", api, RendezvousService(), ControllerSettings("http://r:1"), set()
    )
    job.pods.configure(spec, PodCredentials(api, "ns", "job", JobSecret("the-key", frozenset())))
    return job


@pytest.mark.parametrize(
    ("refuse", "created"),
    [
        (None, ["job-worker-1", "job-worker-2", "job-worker-3", "job-worker-4"]),
        (2, ["job-worker-1", "job-worker-3", "job-worker-4"]),
    ],
)
async def test_the_missing_pods_are_created_at_once(refuse: int | None, created: list[str]) -> None:
    api = ConcurrentApi(4, refuse)
    spec = parse_spec(with_changes(replicas=4))
    job = controller(api, spec)
    if refuse is None:
        await job.pods._create_pods(JOB, spec, 4, ())
    else:
        with pytest.raises(OSError, match="connection reset"):
            await job.pods._create_pods(JOB, spec, 4, ())
    assert sorted(job.pods.ledger.pods.snapshot()) == created
    assert job.pods_created == len(created)


class QuotaApi(SecretWrites, KubeApi):
    """Refuses every create for an exceeded quota while ``full``."""

    def __init__(self) -> None:
        super().__init__()
        self.full = True
        self.number = 0

    async def create_pod(self, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
        if self.full:
            status = {"reason": "Forbidden", "message": 'pods "x" is forbidden: exceeded quota: q'}
            refused = ApiException(status=403, reason="Forbidden")
            refused.body = json.dumps(status)
            raise refused
        self.number += 1
        meta = {**pod["metadata"], "name": f"job-worker-{self.number}", "uid": f"p{self.number}"}
        return {**pod, "metadata": meta, "status": {"phase": "Pending"}}


async def test_creates_refused_for_a_quota_are_told_once_and_tried_again_at_the_next_pass() -> None:
    """Not raised (the controller goes on with the pods it has); a FailedCreate event once until
    a create succeeds."""
    api = QuotaApi()
    spec = parse_spec(with_changes(replicas=2))
    job = controller(api, spec)
    await job.pods._create_pods(JOB, spec, 2, ())
    await job.pods._create_pods(JOB, spec, 2, ())
    told = job.pods.events.take()
    assert [(e.reason, e.warning) for e in told] == [("FailedCreate", True)], told
    assert "exceeded quota" in told[0].message
    api.full = False
    await job.pods._create_pods(JOB, spec, 1, ())
    assert job.pods_created == 1
    api.full = True
    await job.pods._create_pods(JOB, spec, 1, ())
    assert [e.reason for e in job.pods.events.take()] == ["FailedCreate"], "told again"
