"""A job's rendezvous token: kept in a Secret that the job owns, made by the operator.

A Secret of the token's name that the job does not control (by ownerReference) is never
used: whoever made it would know the token. The job fails instead (:class:`RefusedJobError`),
naming the Secret. One that an earlier job of the same name controls is on its way out
(garbage collection removes it): the caller retries later (:class:`StaleObjectError`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from elasticjob.operator import pods as podlib
from elasticjob.operator.adoption import Ownership, ownership
from elasticjob.operator.kube import KubeApi, secret_value

logger = logging.getLogger(__name__)


class RefusedJobError(Exception):
    """The job cannot run as it is; the message says why (for its InvalidSpec condition)."""


class StaleObjectError(Exception):
    """An earlier job of the same name still has the object: retry once it is gone."""


async def ensure_token(api: KubeApi, namespace: str, job: Mapping[str, Any]) -> str:
    """The token of ``job`` from the Secret it owns (made now when there is none). A new
    job (no status yet) makes its Secret at once: one API call on the way to its first
    pods. A job that ran before (the operator restarted) reads it first: a create of an
    existing Secret may be refused for another reason than its existence (a full quota)."""
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
    token = secret_value(secret, podlib.TOKEN_KEY)
    if owner is Ownership.FOREIGN or token is None:
        logger.warning("refusing the Secret %s/%s: not made for this job", namespace, name)
        raise RefusedJobError(
            f"Secret {namespace}/{name} exists but was not made by the operator for this job "
            f"(no controller ownerReference with the job's uid, or no key {podlib.TOKEN_KEY!r})"
            ": its token is not used; delete the Secret or rename the job"
        )
    return token
