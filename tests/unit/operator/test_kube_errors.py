"""Which API errors refuse a job's objects for good (the job fails), and which are retried."""

from __future__ import annotations

import asyncio
import json

import pytest
from kubernetes.client.exceptions import ApiException

from elasticjob.operator.kube import KubeApi, already_exists, refusal

INVALID = 'Pod "x" is invalid: metadata.labels: Invalid value: "aaa": must be no more than 63'


def error(
    status: int, reason: str = "", message: str = "", body: str | None = None
) -> ApiException:
    exc = ApiException(status=status, reason=reason)
    exc.body = body if body is not None else json.dumps({"reason": reason, "message": message})
    return exc


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        pytest.param(
            error(422, "Invalid", INVALID),
            f"the API server refused the job's objects (422): {INVALID}",
            id="invalid",
        ),
        pytest.param(
            error(400, "BadRequest", "json: cannot unmarshal number into image"),
            "the API server refused the job's objects (400): "
            "json: cannot unmarshal number into image",
            id="bad-request",
        ),
        pytest.param(
            error(403, "Forbidden", "pods is forbidden: violates PodSecurity"),
            "the API server refused the job's objects (403): "
            "pods is forbidden: violates PodSecurity",
            id="forbidden",
        ),
        pytest.param(
            error(404, "NotFound", 'namespaces "gone" not found'),
            'the API server refused the job\'s objects (404): namespaces "gone" not found',
            id="not-found",
        ),
        pytest.param(
            error(413, "Request Entity Too Large", body="too large"),
            "the API server refused the job's objects (413): Request Entity Too Large",
            id="too-large-no-status-body",
        ),
        pytest.param(
            error(409, "Conflict", "the object has been modified"),
            "the API server refused the job's objects (409): the object has been modified",
            id="conflict",
        ),
        pytest.param(error(409, "AlreadyExists", "exists"), None, id="already-exists"),
        pytest.param(
            error(403, "Forbidden", "pods is forbidden: exceeded quota: q"), None, id="quota"
        ),
        pytest.param(error(401, "Unauthorized"), None, id="unauthorized-operator"),
        pytest.param(error(429, "TooManyRequests"), None, id="throttled"),
        pytest.param(error(500, "InternalError"), None, id="server-error"),
        pytest.param(error(503, "ServiceUnavailable"), None, id="unavailable"),
    ],
)
def test_refusal(exc: ApiException, expected: str | None) -> None:
    assert refusal(exc) == expected


@pytest.mark.parametrize(
    ("exc", "attempts"),
    [
        pytest.param(error(409, "AlreadyExists", "exists"), 1, id="already-exists-not-retried"),
        pytest.param(error(409, "Conflict", "modified"), 3, id="conflict-retried"),
        pytest.param(error(503, "ServiceUnavailable"), 3, id="unavailable-retried"),
        pytest.param(error(422, "Invalid", INVALID), 1, id="invalid-not-retried"),
    ],
)
async def test_which_errors_are_retried(
    monkeypatch: pytest.MonkeyPatch, exc: ApiException, attempts: int
) -> None:
    real_sleep = asyncio.sleep
    monkeypatch.setattr(asyncio, "sleep", lambda _s: real_sleep(0))  # no backoff wait
    calls: list[float] = []

    def create(**kwargs: float) -> None:
        calls.append(kwargs["_request_timeout"])
        raise exc

    with pytest.raises(ApiException):
        await KubeApi(attempts=3)._call("create", create)
    assert len(calls) == attempts


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        pytest.param(error(409, "AlreadyExists", "exists"), True, id="already-exists"),
        pytest.param(error(409, "Conflict", "modified"), False, id="conflict"),
        pytest.param(error(409, "AlreadyExists", body="not json"), False, id="no-status-body"),
        pytest.param(error(404, "NotFound", "gone"), False, id="not-found"),
    ],
)
def test_already_exists(exc: ApiException, expected: bool) -> None:
    assert already_exists(exc) is expected
