"""Which API errors refuse a job's objects for good (the job fails), and which are retried."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException

from elasticjob.operator.kube import refusal

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
