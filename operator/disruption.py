"""Each job's PodDisruptionBudget: voluntary evictions (a drain, a cluster autoscaler scaling
a node pool in) keep at least ``minReplicas`` worker pods, so they never take a job below its
minimum. Involuntary losses (a node dies, a spot instance is reclaimed) are not evictions; the
job survives those by re-forming.

The budget is named after the job, owned by it (garbage-collected with it) and kept at the
job's ``minReplicas``. ``policy/v1`` is used where the API server serves it (Kubernetes
1.21+), ``policy/v1beta1`` on older clusters.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from kubernetes.client.exceptions import ApiException

from elasticjob.operator import pods as podlib
from elasticjob.operator.api import worker_labels
from elasticjob.operator.kube import KubeApi

logger = logging.getLogger(__name__)

POLICY_VERSIONS: Final = ("policy/v1", "policy/v1beta1")
"""The PodDisruptionBudget API versions the operator uses, the preferred one first."""


def guard_name(job_name: str) -> str:
    """The name of the job's PodDisruptionBudget, and of its NetworkPolicy
    (``pod_guards.py``)."""
    return f"{job_name}-workers"


def disruption_budget(
    job: Mapping[str, Any], min_available: int, api_version: str
) -> dict[str, Any]:
    """The PodDisruptionBudget of ``job``'s worker pods."""
    name = job["metadata"]["name"]
    return {
        "apiVersion": api_version,
        "kind": "PodDisruptionBudget",
        "metadata": podlib.owned_metadata(job, guard_name(name)),
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": worker_labels(name)}},
    }


class DisruptionBudget:
    """Keeps one job's PodDisruptionBudget at its ``minReplicas`` (an API call only when the
    value changes)."""

    def __init__(self, api: KubeApi, namespace: str) -> None:
        self._api = api
        self._namespace = namespace
        self._applied: int | None = None

    async def ensure(self, job: Mapping[str, Any], min_available: int) -> None:
        """Create or update the budget so that it keeps ``min_available`` pods."""
        if self._applied == min_available:
            return
        version = await self._api.served_version(POLICY_VERSIONS)
        if version is None:
            logger.warning("the API server serves no PodDisruptionBudget API: none is made")
            self._applied = min_available
            return
        try:
            await self._api.apply_owned(
                self._namespace,
                disruption_budget(job, min_available, version),
                "poddisruptionbudgets",
            )
        except ApiException as exc:
            # The job runs without it (e.g. the operator's role lacks the permission); tried
            # again when minReplicas changes.
            logger.warning(
                "could not make the PodDisruptionBudget %s/%s: %s %s",
                self._namespace,
                guard_name(job["metadata"]["name"]),
                exc.status,
                exc.reason,
            )
            self._applied = min_available
            return
        logger.info(
            "PodDisruptionBudget %s/%s keeps %d worker pods",
            self._namespace,
            guard_name(job["metadata"]["name"]),
            min_available,
        )
        self._applied = min_available
