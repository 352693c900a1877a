"""A job's NetworkPolicy: only its own worker pods may connect to its workers; made once,
beside the budget, unless the operator is told not to."""

from __future__ import annotations

from typing import Any, cast

import pytest
from kubernetes.client.exceptions import ApiException

from elasticjob.operator.kube import KubeApi
from elasticjob.operator.pod_guards import PodGuards, worker_network_policy

JOB = {"metadata": {"name": "train", "uid": "uid-1"}}
WORKERS = {"elasticjob.dev/job-name": "train", "elasticjob.dev/role": "worker"}


def test_the_policy_admits_only_the_jobs_worker_pods_to_them_and_belongs_to_the_job() -> None:
    policy = worker_network_policy(JOB)
    assert (policy["apiVersion"], policy["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy")
    assert policy["metadata"]["name"] == "train-workers"
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": WORKERS}
    assert spec["policyTypes"] == ["Ingress"]
    assert spec["ingress"] == [{"from": [{"podSelector": {"matchLabels": WORKERS}}]}]
    (owner,) = policy["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("ElasticJob", "uid-1", True)


class RecordingApi:
    def __init__(self, fail_policy: bool = False) -> None:
        self.applied: list[tuple[str, str]] = []
        self.fail_policy = fail_policy

    async def served_version(self, candidates: tuple[str, ...]) -> str | None:
        return candidates[0]

    async def apply_owned(self, namespace: str, obj: dict[str, Any], plural: str) -> None:
        if self.fail_policy and plural == "networkpolicies":
            raise ApiException(status=403, reason="Forbidden")
        self.applied.append((plural, obj["metadata"]["name"]))


@pytest.mark.parametrize(
    ("network_policy", "expected"),
    [
        pytest.param(
            True,
            [("poddisruptionbudgets", "train-workers"), ("networkpolicies", "train-workers")],
            id="made once beside the budget",
        ),
        pytest.param(False, [("poddisruptionbudgets", "train-workers")], id="switched off"),
    ],
)
async def test_the_policy_is_made_once_unless_switched_off(
    network_policy: bool, expected: list[tuple[str, str]]
) -> None:
    api = RecordingApi()
    guards = PodGuards(cast(KubeApi, api), "ns", network_policy=network_policy)
    for _ in range(3):
        await guards.ensure(JOB, 2)
    assert api.applied == expected


async def test_without_the_permission_the_job_runs_without_a_policy_and_it_is_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = RecordingApi(fail_policy=True)
    guards = PodGuards(cast(KubeApi, api), "ns", network_policy=True)
    for _ in range(3):
        await guards.ensure(JOB, 2)
    warnings = [
        r.getMessage() for r in caplog.records if r.name == "elasticjob.operator.pod_guards"
    ]
    assert len(warnings) == 1 and "403" in warnings[0], warnings
