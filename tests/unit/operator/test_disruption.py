"""A job's PodDisruptionBudget: its manifest, and when the operator writes it."""

from __future__ import annotations

from typing import Any, cast

import pytest
from kubernetes.client.exceptions import ApiException

from elasticjob.operator.disruption import POLICY_VERSIONS, DisruptionBudget, disruption_budget
from elasticjob.operator.kube import KubeApi

JOB = {"metadata": {"name": "train", "uid": "uid-1"}}


def test_the_budget_keeps_min_available_worker_pods_and_belongs_to_the_job() -> None:
    budget = disruption_budget(JOB, 3, "policy/v1beta1")
    assert budget["apiVersion"] == "policy/v1beta1" and budget["kind"] == "PodDisruptionBudget"
    assert budget["metadata"]["name"] == "train-workers"
    assert budget["spec"]["minAvailable"] == 3
    labels = budget["spec"]["selector"]["matchLabels"]
    assert labels == {"elasticjob.dev/job-name": "train", "elasticjob.dev/role": "worker"}
    (owner,) = budget["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("ElasticJob", "uid-1", True)


class FakeApi:
    def __init__(self, served: tuple[str, ...], fail: int | None = None) -> None:
        self.served = served
        self.fail = fail
        self.applied: list[dict[str, Any]] = []

    async def served_version(self, candidates: tuple[str, ...]) -> str | None:
        return next((v for v in candidates if v in self.served), None)

    async def apply_owned(self, namespace: str, obj: dict[str, Any], plural: str) -> None:
        if self.fail is not None:
            raise ApiException(status=self.fail, reason="Forbidden")
        self.applied.append(obj)


@pytest.mark.parametrize(
    ("served", "version"),
    [
        pytest.param(("policy/v1", "policy/v1beta1"), "policy/v1", id="v1-preferred"),
        pytest.param(("policy/v1beta1",), "policy/v1beta1", id="older-cluster"),
    ],
)
async def test_the_budget_is_written_when_min_replicas_changes_only(
    served: tuple[str, ...], version: str
) -> None:
    api = FakeApi(served)
    budget = DisruptionBudget(cast(KubeApi, api), "ns")
    for minimum in (2, 2, 3, 3):
        await budget.ensure(JOB, minimum)
    assert [(b["apiVersion"], b["spec"]["minAvailable"]) for b in api.applied] == [
        (version, 2),
        (version, 3),
    ]
    assert POLICY_VERSIONS[0] == "policy/v1"


async def test_without_a_policy_api_or_the_permission_the_job_runs_without_a_budget(
    caplog: pytest.LogCaptureFixture,
) -> None:
    await DisruptionBudget(cast(KubeApi, FakeApi(())), "ns").ensure(JOB, 2)
    api = FakeApi(("policy/v1",), fail=403)
    budget = DisruptionBudget(cast(KubeApi, api), "ns")
    await budget.ensure(JOB, 2)
    await budget.ensure(JOB, 2)
    # The operator's warnings only: other tests' threads may log meanwhile.
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelname == "WARNING" and r.name.startswith("elasticjob.operator.")
    ]
    assert len(warnings) == 2, warnings
    assert "serves no PodDisruptionBudget API" in warnings[0]
    assert "403" in warnings[1], "tried once for this minimum, and said why it failed"
