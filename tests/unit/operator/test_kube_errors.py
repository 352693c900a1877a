"""What API errors mean: which refuse a job's objects for good (the job fails), which are
retried, and how create-or-update (``upsert``) follows them."""

from __future__ import annotations

import asyncio
import json

import pytest
from kubernetes.client.exceptions import ApiException

from elasticjob.operator.kube_errors import (
    ApiOutcome,
    api_outcome,
    classify,
    permanent_error,
    refused_for_now,
)
from elasticjob.operator.kube_transport import KubeTransport

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
def test_permanent_error(exc: ApiException, expected: str | None) -> None:
    assert permanent_error(exc) == expected


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
        await KubeTransport(attempts=3).call("create", create)
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
    assert (api_outcome(exc) is ApiOutcome.ALREADY_EXISTS) is expected


@pytest.mark.parametrize(
    ("status", "reason", "message", "expected"),
    [
        pytest.param(503, "ServiceUnavailable", "", ApiOutcome.RETRY, id="status-in-table"),
        pytest.param(409, "Conflict", "modified", ApiOutcome.CONFLICT, id="conflict"),
        pytest.param(409, "AlreadyExists", "", ApiOutcome.ALREADY_EXISTS, id="already-exists"),
        pytest.param(403, "Forbidden", "exceeded quota: q", ApiOutcome.OTHER, id="quota"),
        pytest.param(401, "Unauthorized", "", ApiOutcome.OTHER, id="status-not-in-table"),
        pytest.param(None, None, "", ApiOutcome.OTHER, id="no-status"),
    ],
)
def test_classify(
    status: int | None, reason: str | None, message: str, expected: ApiOutcome
) -> None:
    assert classify(status, reason, message) is expected


def test_the_table() -> None:
    """Every other 4xx and 5xx status means OTHER."""
    meanings = {status: classify(status, None, "") for status in range(400, 600)}
    assert {s: o for s, o in meanings.items() if o is not ApiOutcome.OTHER} == {
        400: ApiOutcome.REFUSED,
        403: ApiOutcome.REFUSED,
        404: ApiOutcome.NOT_FOUND,
        408: ApiOutcome.RETRY,
        409: ApiOutcome.CONFLICT,
        413: ApiOutcome.REFUSED,
        422: ApiOutcome.REFUSED,
        429: ApiOutcome.RETRY,
        500: ApiOutcome.RETRY,
        502: ApiOutcome.RETRY,
        503: ApiOutcome.RETRY,
        504: ApiOutcome.RETRY,
    }


async def test_a_call_pauses_as_its_backoff_says(monkeypatch: pytest.MonkeyPatch) -> None:
    real_sleep = asyncio.sleep
    pauses: list[float] = []

    async def sleep(seconds: float) -> None:
        pauses.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)

    def fail(**kwargs: float) -> None:
        raise OSError("connection refused")

    with pytest.raises(OSError):
        await KubeTransport(attempts=4).call("read", fail)
    assert pauses == [0.2, 0.4, 0.8]


@pytest.mark.parametrize(
    ("exc", "for_now"),
    [
        pytest.param(
            error(403, "Forbidden", "pods is forbidden: exceeded quota: q"), True, id="quota"
        ),
        pytest.param(error(403, "Forbidden", "violates PodSecurity"), False, id="forbidden"),
        pytest.param(error(422, "Invalid", INVALID), False, id="invalid"),
        pytest.param(error(500, "InternalError", "etcd"), False, id="server-error"),
    ],
)
def test_refused_for_now(exc: ApiException, for_now: bool) -> None:
    assert refused_for_now(exc) is for_now
