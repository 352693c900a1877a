"""A job's token Secret: made at once for a new job, read first for one that ran before, and
never taken from a Secret the job does not own."""

from __future__ import annotations

import base64
from typing import Any, cast

import pytest

from elasticjob.operator import pods as podlib
from elasticjob.operator.kube import KubeApi
from elasticjob.operator.token import RefusedJobError, StaleObjectError, ensure_token

JOB: dict[str, Any] = {
    "apiVersion": "elasticjob.dev/v1alpha1",
    "kind": "ElasticJob",
    "metadata": {"name": "train", "uid": "uid-1"},
}
NAME = podlib.token_secret_name("train")


def stored(secret: dict[str, Any]) -> dict[str, Any]:
    """``secret`` as the API server answers it (``stringData`` turned into ``data``)."""
    data = {k: base64.b64encode(v.encode()).decode() for k, v in secret["stringData"].items()}
    return {**{k: v for k, v in secret.items() if k != "stringData"}, "data": data}


class FakeSecrets:
    def __init__(self, existing: dict[str, Any] | None = None) -> None:
        self.secret = existing
        self.calls: list[str] = []

    async def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append("read")
        return self.secret

    async def create_secret(self, namespace: str, secret: dict[str, Any]) -> dict[str, Any] | None:
        self.calls.append("create")
        if self.secret is not None:
            return None  # 409: the name exists
        self.secret = stored(secret)
        return self.secret


def token_of(secret: dict[str, Any] | None) -> str:
    assert secret is not None
    return base64.b64decode(secret["data"][podlib.TOKEN_KEY]).decode()


async def test_a_new_jobs_secret_is_made_with_one_call() -> None:
    api = FakeSecrets()
    token = await ensure_token(cast(KubeApi, api), "ns", JOB)
    assert api.calls == ["create"] and token == token_of(api.secret)


@pytest.mark.parametrize("present", [True, False])
async def test_a_job_that_ran_before_reads_its_secret_first(present: bool) -> None:
    own = stored(podlib.token_secret(JOB))
    api = FakeSecrets(own if present else None)
    token = await ensure_token(cast(KubeApi, api), "ns", {**JOB, "status": {"round": 3}})
    assert api.calls == (["read"] if present else ["read", "create"])
    assert token == token_of(api.secret)


@pytest.mark.parametrize(
    ("owner", "raised"),
    [
        pytest.param({"uid": "uid-0", "kind": "ElasticJob", "name": "train"}, StaleObjectError),
        pytest.param({"uid": "uid-9", "kind": "ElasticJob", "name": "other"}, RefusedJobError),
        pytest.param(None, RefusedJobError),
    ],
    ids=["an-earlier-job-of-the-name", "another-job", "nobody"],
)
async def test_a_secret_the_job_does_not_own_is_never_used(
    owner: dict[str, Any] | None, raised: type[Exception]
) -> None:
    foreign = stored(podlib.token_secret(JOB))
    refs = [] if owner is None else [{**owner, "controller": True, "apiVersion": "v1"}]
    foreign["metadata"] = {**foreign["metadata"], "ownerReferences": refs}
    api = FakeSecrets(foreign)
    with pytest.raises(raised):
        await ensure_token(cast(KubeApi, api), "ns", JOB)
    assert api.calls == ["create", "read"], "the create finds the name taken"
