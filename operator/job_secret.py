"""A job's Secret: its rendezvous key, its reader token and each worker pod's own credential
(``elasticjob.rendezvous.job_credentials``), made by the operator and owned by the job.

A Secret of its name that the job does not control (by ownerReference) is never used:
whoever made it would know the key. The job fails instead (:class:`RefusedJobError`), naming
the Secret. One that an earlier job of the same name controls is on its way out (garbage
collection removes it): the caller retries later (:class:`StaleObjectError`).

No pod reads the key. The operator names a pod before it creates it, and writes the pod's
credential into the Secret under the pod's name first (:class:`PodCredentials`); the pod's
worker container reads that one key. A pod so speaks for itself only; a pod that is gone has
its key removed with the next write (a pass of the job's controller).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from elasticjob.operator import pods as podlib
from elasticjob.operator.adoption import Ownership, ownership
from elasticjob.operator.kube import KubeApi, secret_value
from elasticjob.rendezvous.job_credentials import JobKey

logger = logging.getLogger(__name__)


class RefusedJobError(Exception):
    """The job cannot run as it is; the message says why (for its InvalidSpec condition)."""


class StaleObjectError(Exception):
    """An earlier job of the same name still has the object: retry once it is gone."""


@dataclass(frozen=True)
class JobSecret:
    """What the job's Secret holds: the job's key, and the pods it holds credentials of."""

    key: str = field(repr=False)
    pods: frozenset[str]


async def ensure_job_secret(api: KubeApi, namespace: str, job: Mapping[str, Any]) -> JobSecret:
    """What the Secret ``job`` owns holds (made now when there is none). A new job (no status
    yet) makes its Secret at once: one API call on the way to its first pods. A job that ran
    before (the operator restarted) reads it first: a create of an existing Secret may be
    refused for another reason than its existence (a full quota)."""
    name = podlib.token_secret_name(job["metadata"]["name"])
    secret = await api.read_secret(namespace, name) if job.get("status") else None
    if secret is None:
        secret = await api.create_secret(namespace, podlib.token_secret(job))
    if secret is None:  # the name exists: the job's own Secret, or another's
        secret = await api.read_secret(namespace, name)
    if secret is None:
        raise StaleObjectError(f"Secret {namespace}/{name} vanished while it was being made")
    owner = ownership(secret, job)
    if owner is Ownership.STALE:
        raise StaleObjectError(f"Secret {namespace}/{name} still belongs to an earlier job")
    key = secret_value(secret, podlib.KEY_KEY)
    if owner is Ownership.FOREIGN or key is None:
        logger.warning("refusing the Secret %s/%s: not made for this job", namespace, name)
        raise RefusedJobError(
            f"Secret {namespace}/{name} exists but was not made by the operator for this job "
            f"(no controller ownerReference with the job's uid, or no key {podlib.KEY_KEY!r})"
            ": its key is not used; delete the Secret or rename the job"
        )
    pods = frozenset(secret.get("data") or {}) - {podlib.KEY_KEY, podlib.READER_KEY}
    return JobSecret(key, pods)


class PodCredentials:
    """Writes each new pod's credential into the job's Secret before the pod is created, and
    removes those of pods that are gone."""

    def __init__(self, api: KubeApi, namespace: str, job_name: str, secret: JobSecret) -> None:
        self._api = api
        self._namespace = namespace
        self._secret = podlib.token_secret_name(job_name)
        self._key = JobKey(secret.key)
        self._written = set(secret.pods)
        """The pods whose credentials the Secret holds."""

    async def issue(self, new: Iterable[str], present: Iterable[str]) -> None:
        """Write the credentials of the pods ``new`` (about to be created), and remove those
        of the pods that are neither new nor ``present`` (gone, or never created), in one
        patch (none if nothing changes)."""
        new = set(new)
        gone = self._written - new - set(present)
        data: dict[str, str | None] = dict.fromkeys(gone)
        for name in new:
            credential = self._key.worker_credential(name).encode()
            data[name] = base64.b64encode(credential).decode()
        if data:
            await self._api.fill_secret(self._namespace, self._secret, data, None)
            self._written = (self._written - gone) | new
