"""Which objects are a job's own: only those it controls by ownerReference."""

from __future__ import annotations

from typing import Any

import pytest

from elasticjob.operator.adoption import Ownership, ownership
from elasticjob.operator.pods import owner_reference, token_secret

JOB = {"metadata": {"name": "train", "namespace": "ml", "uid": "uid-1"}}
LABELS = {"elasticjob.dev/job-name": "train", "elasticjob.dev/role": "worker"}


def obj(*refs: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "p", "labels": LABELS, "ownerReferences": list(refs)}}


def ref(**changes: Any) -> dict[str, Any]:
    return {**owner_reference(JOB), **changes}


@pytest.mark.parametrize(
    ("found", "expected"),
    [
        pytest.param(obj(ref()), Ownership.OWNED, id="controlled-by-the-job"),
        pytest.param(
            obj({"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "x"}, ref()),
            Ownership.OWNED,
            id="among-other-owners",
        ),
        pytest.param({"metadata": {"labels": LABELS}}, Ownership.FOREIGN, id="labels-only"),
        pytest.param(obj(), Ownership.FOREIGN, id="empty-owners"),
        pytest.param(obj(ref(controller=False)), Ownership.FOREIGN, id="owner-not-controller"),
        pytest.param(obj(ref(controller=None)), Ownership.FOREIGN, id="controller-unset"),
        pytest.param(obj(ref(uid="uid-0")), Ownership.STALE, id="an-earlier-job-of-the-same-name"),
        pytest.param(obj(ref(uid="uid-0", name="other")), Ownership.FOREIGN, id="another-jobs"),
        pytest.param(
            obj(ref(uid="uid-0", kind="Deployment")), Ownership.FOREIGN, id="another-kind"
        ),
    ],
)
def test_ownership(found: dict[str, Any], expected: Ownership) -> None:
    assert ownership(found, JOB) is expected


def test_the_token_secret_the_operator_makes_is_the_jobs_own() -> None:
    assert ownership(token_secret(JOB), JOB) is Ownership.OWNED
