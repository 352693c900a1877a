"""Who may speak for a job on the rendezvous service: its name must be a Kubernetes object
name, and its workers show its token (``Authorization: Bearer``), compared in constant
time."""

from __future__ import annotations

import hmac
from typing import Final

from pydantic import TypeAdapter, ValidationError

from elasticjob.wire.messages import JobName

_JOB_NAME: Final = TypeAdapter(JobName)


def check_job_name(job: str) -> None:
    """Raise :class:`ValueError` unless ``job`` is a valid job name."""
    try:
        _JOB_NAME.validate_python(job)
    except ValidationError as exc:
        raise ValueError(f"invalid job name {job!r}: must be a Kubernetes object name") from exc


class JobToken:
    """A job's token; raises :class:`ValueError` if it is empty or not printable ASCII without
    spaces (it travels in an HTTP header)."""

    def __init__(self, token: str) -> None:
        if not token or not token.isascii() or not token.isprintable() or " " in token:
            raise ValueError("a job token must be non-empty printable ASCII without spaces")
        self._token = token.encode("ascii")

    def matches(self, token: str) -> bool:
        """Whether ``token`` is this token (compared in constant time)."""
        return hmac.compare_digest(self._token, token.encode("utf-8", "surrogatepass"))
