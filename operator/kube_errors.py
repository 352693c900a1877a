"""What an error of the Kubernetes API means for the operator: one table, read by the retries
(``kube_transport``), by create-or-update (``kube_transport.upsert``), by reads and deletes
(``kube``) and by the controller (:func:`permanent_error`: the job fails).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from typing import Any, Final

from kubernetes.client.exceptions import ApiException


class ApiOutcome(enum.Enum):
    """What an API error means."""

    RETRY = "retry"
    """Transient (a timeout, throttling, the API server or etcd away): the same call is tried
    again after a pause."""
    CONFLICT = "conflict"
    """The object changed under the request (409 other than AlreadyExists): the same call is
    tried again; one still conflicting after every attempt refuses the job for good."""
    ALREADY_EXISTS = "already exists"
    """A create of an object whose name is taken: no retry changes it; create-or-update
    updates it instead."""
    NOT_FOUND = "not found"
    """No such object (a read answers None, a delete is done, create-or-update creates it);
    for the objects of a job (its namespace gone) a refusal for good."""
    REFUSED = "refused for good"
    """Invalid, forbidden, too large: no retry changes it, and the job fails."""
    OTHER = "other"
    """Not retried now and not a refusal of the job (the operator is not authorized, a quota
    is exceeded): the caller's next pass tries again."""


_BY_STATUS: Final[Mapping[int, ApiOutcome]] = {
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
"""The meaning of each HTTP status, before the two refinements of :func:`classify`."""

_PERMANENT: Final = frozenset({ApiOutcome.REFUSED, ApiOutcome.NOT_FOUND, ApiOutcome.CONFLICT})
"""The outcomes that refuse a job's objects for good (a conflict once its retries are spent)."""


def classify(status: int | None, reason: str | None, message: str) -> ApiOutcome:
    """What an answer of ``status`` with the ``reason`` and ``message`` of its ``Status``
    object means: :data:`_BY_STATUS`, except that a 409 ``AlreadyExists`` is
    :attr:`ApiOutcome.ALREADY_EXISTS` and a 403 for an exceeded quota is
    :attr:`ApiOutcome.OTHER` (pods may fit once others end)."""
    outcome = _BY_STATUS.get(status or 0, ApiOutcome.OTHER)
    if outcome is ApiOutcome.CONFLICT and reason == "AlreadyExists":
        return ApiOutcome.ALREADY_EXISTS
    if status == 403 and "exceeded quota" in message:
        return ApiOutcome.OTHER
    return outcome


def _status_of(exc: ApiException) -> dict[str, Any]:
    """The ``Status`` object the API server answered with (empty when there is none)."""
    try:
        status = json.loads(exc.body or "")
    except ValueError:
        status = None
    return status if isinstance(status, dict) else {}


def refused_for_now(exc: ApiException) -> bool:
    """Whether the API server refused an object that it may accept later (an exceeded
    quota: pods may fit once others end)."""
    return exc.status == 403 and api_outcome(exc) is ApiOutcome.OTHER


def api_message(exc: ApiException) -> str:
    """The API server's message for ``exc`` (its HTTP reason when it sent no ``Status``)."""
    return str(_status_of(exc).get("message") or exc.reason or f"HTTP {exc.status}")


def api_outcome(exc: ApiException) -> ApiOutcome:
    """What ``exc`` means (:func:`classify` of its status and ``Status`` object)."""
    status = _status_of(exc)
    return classify(exc.status, status.get("reason"), api_message(exc))


def permanent_error(exc: ApiException) -> str | None:
    """Why the API server refuses the job's objects for good, quoting it, when ``exc`` says
    so (no retry changes it: the object is invalid, forbidden, too large, its namespace is
    gone...), else None."""
    if api_outcome(exc) not in _PERMANENT:
        return None
    return f"the API server refused the job's objects ({exc.status}): {api_message(exc)}"
