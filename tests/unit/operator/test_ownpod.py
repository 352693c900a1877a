"""What the operator learns from its own pod: the decision, row by row, and the loop that
follows the pod with a scripted API."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from elasticjob.operator.ownpod import OwnPod, follow_own_pod, own_pod

DELETED_AT = "2026-11-23T05:00:00Z"


def pod(*, ready: str | None = "True", deleting: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "op-1", "namespace": "system"}
    if deleting:
        metadata["deletionTimestamp"] = DELETED_AT
    conditions = [{"type": "PodScheduled", "status": "True"}]
    if ready is not None:
        conditions.append({"type": "Ready", "status": ready})
    return {"metadata": metadata, "status": {"conditions": conditions}}


@pytest.mark.parametrize(
    ("seen", "expected"),
    [
        (pod(), OwnPod(ready=True, stop_reason=None)),
        (pod(ready="False"), OwnPod(ready=False, stop_reason=None)),
        (pod(ready=None), OwnPod(ready=False, stop_reason=None)),
        ({}, OwnPod(ready=False, stop_reason=None)),
        (
            pod(ready="False", deleting=True),
            OwnPod(ready=False, stop_reason=f"its pod is being deleted (since {DELETED_AT})"),
        ),
        (
            pod(deleting=True),
            OwnPod(ready=True, stop_reason=f"its pod is being deleted (since {DELETED_AT})"),
        ),
        (None, OwnPod(ready=False, stop_reason="its pod no longer exists")),
    ],
    ids=["ready", "not-ready", "no-ready-condition", "empty", "evicted", "deleted", "gone"],
)
def test_own_pod(seen: Mapping[str, Any] | None, expected: OwnPod) -> None:
    assert own_pod(seen) == expected


async def test_following_reports_readiness_through_errors_until_the_pod_is_deleted() -> None:
    answers: list[Mapping[str, Any] | Exception | None] = [
        pod(),
        ApiException(status=500, reason="etcd is away"),
        pod(ready="False"),
        OSError("connection refused"),
        pod(ready="False", deleting=True),
    ]
    reads: list[int] = []
    readiness: list[bool] = []

    async def read_pod() -> Mapping[str, Any] | None:
        answer = answers[len(reads)]
        reads.append(1)
        if isinstance(answer, Exception):
            raise answer
        return answer

    reason = await asyncio.wait_for(follow_own_pod(read_pod, readiness.append, interval_s=0), 5)
    assert reason.startswith("its pod is being deleted") and len(reads) == len(answers)
    assert readiness == [True, False, False], "a failed read tells nothing"


async def test_an_error_that_is_not_the_apis_propagates() -> None:
    async def read_pod() -> Mapping[str, Any] | None:
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        await asyncio.wait_for(follow_own_pod(read_pod, lambda _: None, interval_s=0), 5)
