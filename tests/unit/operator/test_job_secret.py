"""A job's Secret: made at once for a new job, read first for one that ran before, never
taken from a Secret the job does not own; each pod's credential written before the pod is
made, and removed once the pod is gone."""

from __future__ import annotations

import base64
from typing import Any, cast

import pytest

from elasticjob.operator import pods as podlib
from elasticjob.operator.job_secret import (
    JobSecret,
    PodCredentials,
    RefusedJobError,
    StaleObjectError,
    ensure_job_secret,
)
from elasticjob.operator.kube import KubeApi
from elasticjob.rendezvous.job_credentials import JobKey, Speaker

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


def value_of(secret: dict[str, Any] | None, key: str = podlib.KEY_KEY) -> str:
    assert secret is not None
    return base64.b64decode(secret["data"][key]).decode()


async def test_a_new_jobs_secret_is_made_with_one_call() -> None:
    api = FakeSecrets()
    secret = await ensure_job_secret(cast(KubeApi, api), "ns", JOB)
    assert api.calls == ["create"] and secret == JobSecret(value_of(api.secret), frozenset())
    reader = value_of(api.secret, podlib.READER_KEY)
    assert JobKey(secret.key).speaker(reader) == Speaker(None), "the reader token is the key's"


@pytest.mark.parametrize("present", [True, False])
async def test_a_job_that_ran_before_reads_its_secret_first(present: bool) -> None:
    own = stored(podlib.token_secret(JOB))
    api = FakeSecrets(own if present else None)
    secret = await ensure_job_secret(cast(KubeApi, api), "ns", {**JOB, "status": {"round": 3}})
    assert api.calls == (["read"] if present else ["read", "create"])
    assert secret.key == value_of(api.secret)


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
        await ensure_job_secret(cast(KubeApi, api), "ns", JOB)
    assert api.calls == ["create", "read"], "the create finds the name taken"


class FakeSecretWrites:
    def __init__(self, fail: bool = False) -> None:
        self.writes: list[dict[str, str | None]] = []
        self.fail = fail

    async def fill_secret(
        self, namespace: str, name: str, data: dict[str, str | None], version: str | None
    ) -> bool:
        assert (namespace, name, version) == ("ns", NAME, None)
        if self.fail:
            raise OSError("the API server is unreachable")
        self.writes.append(dict(data))
        return True


def decoded(value: str | None) -> str | None:
    return None if value is None else base64.b64decode(value).decode()


def credentials(api: FakeSecretWrites, *held: str) -> PodCredentials:
    return PodCredentials(cast(KubeApi, api), "ns", "train", JobSecret("k", frozenset(held)))


async def test_each_pods_credential_is_written_before_it_is_made_and_removed_once_gone() -> None:
    api = FakeSecretWrites()
    pods = credentials(api)
    await pods.issue([], [])
    assert api.writes == [], "nothing to write: no call"
    await pods.issue(["train-worker-b2c4d", "train-worker-f5g6h"], [])
    (written,) = api.writes
    assert {k: decoded(v) for k, v in written.items()} == {
        name: JobKey("k").worker_credential(name)
        for name in ("train-worker-b2c4d", "train-worker-f5g6h")
    }
    await pods.issue([], ["train-worker-b2c4d", "train-worker-f5g6h"])
    assert len(api.writes) == 1, "both pods are there: nothing to write"
    await pods.issue(["train-worker-k7l8m"], ["train-worker-f5g6h"])
    assert api.writes[1]["train-worker-b2c4d"] is None, "a gone pod's key goes in the same write"
    assert JobKey("k").speaker(decoded(api.writes[1]["train-worker-k7l8m"]) or "") == (
        Speaker("train-worker-k7l8m")
    )
    assert "train-worker-f5g6h" not in api.writes[1]
    await pods.issue([], ["train-worker-f5g6h", "train-worker-k7l8m"])
    assert len(api.writes) == 2, "nothing left to remove"


async def test_the_keys_a_restarted_operator_finds_are_removed_once_their_pods_are_gone() -> None:
    api = FakeSecretWrites()
    pods = credentials(api, "train-worker-b2c4d", "train-worker-f5g6h")
    await pods.issue([], ["train-worker-f5g6h"])
    assert api.writes == [{"train-worker-b2c4d": None}]


async def test_a_failed_write_keeps_the_gone_pods_for_the_next() -> None:
    api = FakeSecretWrites(fail=True)
    pods = credentials(api, "train-worker-b2c4d")
    with pytest.raises(OSError):
        await pods.issue(["train-worker-k7l8m"], [])
    api.fail = False
    await pods.issue([], [])
    assert api.writes == [{"train-worker-b2c4d": None}]


def test_a_pod_name_is_the_jobs_prefix_and_five_letters_within_a_dns_label() -> None:
    short = podlib.new_pod_name("train")
    assert short.startswith("train-worker-") and len(short) == len("train-worker-") + 5
    assert set(short[-5:]) <= set(podlib.POD_NAME_ALPHABET)
    long = podlib.new_pod_name("j" * 63)
    assert len(long) == podlib.POD_NAME_MAX and long.startswith("j" * 58)
