"""Who may speak for a job on the rendezvous service, and for which of its workers.

A job has a *key* that its workers never see: the operator keeps it in the job's Secret, the
launcher in its own memory. Every credential is derived from it (HMAC-SHA256):

- a worker's credential, ``<hostname>.<mac of the hostname>``: what one pod (or one host of
  the launcher, all its slots) shows, and the only one that may speak for that host: register
  for a round, report a result, beat, report progress as rank 0, join or report a health
  check. Its hostname is written in it, so the service knows who speaks before it reads the
  body; the body's ``hostname`` must then be the same.
- the job's *reader* token: reads what is job-wide (the round, the plan, the notices) and
  speaks for no worker; for people and tools watching the job.

Every credential travels as ``Authorization: Bearer``; it is compared in constant time. The
key itself is no credential. A job's name must be a Kubernetes object name.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Final, NamedTuple

from pydantic import TypeAdapter, ValidationError

from elasticjob.wire.messages import JobName

_JOB_NAME: Final = TypeAdapter(JobName)
_WORKER: Final = b"worker\x00"
_READER: Final = b"reader\x00"
_SEPARATOR: Final = "."
"""Between a worker credential's hostname and its MAC (hexadecimal: never a dot)."""


def check_job_name(job: str) -> None:
    """Raise :class:`ValueError` unless ``job`` is a valid job name."""
    try:
        _JOB_NAME.validate_python(job)
    except ValidationError as exc:
        raise ValueError(f"invalid job name {job!r}: must be a Kubernetes object name") from exc


class Speaker(NamedTuple):
    """Who a valid credential speaks for: one host of the job, or nobody (the reader token)."""

    hostname: str | None

    def __str__(self) -> str:
        return (
            "the job's reader token" if self.hostname is None else f"{self.hostname}'s credential"
        )

    def speaks_for(self, hostname: str) -> bool:
        """Whether this credential may speak for the worker(s) on ``hostname``."""
        return self.hostname is not None and self.hostname == hostname


class JobKey:
    """A job's key, and the credentials derived from it. Raises :class:`ValueError` if the
    key is empty or not printable ASCII without spaces."""

    def __init__(self, key: str) -> None:
        if not key or not key.isascii() or not key.isprintable() or " " in key:
            raise ValueError("a job key must be non-empty printable ASCII without spaces")
        self._key = key.encode("ascii")
        self._reader = self._mac(_READER, "")

    def __repr__(self) -> str:
        return "JobKey(...)"

    def _mac(self, domain: bytes, text: str) -> str:
        data = domain + text.encode("utf-8", "surrogatepass")  # a header may hold anything
        return hmac.new(self._key, data, hashlib.sha256).hexdigest()

    def worker_credential(self, hostname: str) -> str:
        """The credential of the worker(s) on ``hostname`` (a pod's name, a launcher host)."""
        return f"{hostname}{_SEPARATOR}{self._mac(_WORKER, hostname)}"

    def reader_token(self) -> str:
        """The job's reader token: reads what is job-wide, speaks for no worker."""
        return self._reader

    def speaker(self, bearer: str) -> Speaker | None:
        """Who ``bearer`` speaks for, or None if it is no credential of this job (a hostname
        the key never made a credential for cannot match its MAC)."""
        hostname, separator, mac = bearer.rpartition(_SEPARATOR)
        if not separator:
            return Speaker(None) if _equal(bearer, self._reader) else None
        return Speaker(hostname) if _equal(mac, self._mac(_WORKER, hostname)) else None


def _equal(sent: str, expected: str) -> bool:
    return hmac.compare_digest(sent.encode("utf-8", "surrogatepass"), expected.encode())
