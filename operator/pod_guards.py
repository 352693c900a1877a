"""What guards a job's worker pods besides the operator: the PodDisruptionBudget
(``disruption.py``: voluntary evictions keep ``minReplicas`` pods) and the NetworkPolicy.

The NetworkPolicy (unless the operator is told not to make one: the chart's
``workerNetworkPolicy.enabled``) admits to the job's worker pods only connections from the
job's own worker pods: the store, the collectives' links and the peers' probes are the job's
business. Anything else a worker serves (metrics for a scraper, say) needs a NetworkPolicy of
its own that admits it: policies add up. Where no network plugin enforces NetworkPolicies, it
is inert. Like the budget it is named ``<job>-workers``, owned by the job and
garbage-collected with it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final

from kubernetes.client.exceptions import ApiException

from elasticjob.operator import pods as podlib
from elasticjob.operator.api import worker_labels
from elasticjob.operator.disruption import DisruptionBudget, guard_name
from elasticjob.operator.kube import KubeApi

logger = logging.getLogger(__name__)

NETWORK_POLICY_VERSION: Final = "networking.k8s.io/v1"


def worker_network_policy(job: Mapping[str, Any]) -> dict[str, Any]:
    """The NetworkPolicy of ``job``'s worker pods: ingress from the job's worker pods only."""
    name = job["metadata"]["name"]
    workers = {"matchLabels": worker_labels(name)}
    return {
        "apiVersion": NETWORK_POLICY_VERSION,
        "kind": "NetworkPolicy",
        "metadata": podlib.owned_metadata(job, guard_name(name)),
        "spec": {
            "podSelector": workers,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": workers}]}],
        },
    }


class PodGuards:
    """Keeps one job's guards: its budget at ``minReplicas``, and its NetworkPolicy (made
    once, when ``network_policy``)."""

    def __init__(self, api: KubeApi, namespace: str, *, network_policy: bool) -> None:
        self._api = api
        self._namespace = namespace
        self._budget = DisruptionBudget(api, namespace)
        self._policy_due = network_policy

    async def ensure(self, job: Mapping[str, Any], min_available: int) -> None:
        """Create or update what guards the job's pods (an API call only for a change)."""
        await self._budget.ensure(job, min_available)
        if not self._policy_due:
            return
        self._policy_due = False  # once: on failure the job runs without it, as without a budget
        policy = worker_network_policy(job)
        try:
            await self._api.apply_owned(self._namespace, policy, "networkpolicies")
        except ApiException as exc:
            logger.warning(
                "could not make the NetworkPolicy %s/%s: %s %s",
                self._namespace,
                policy["metadata"]["name"],
                exc.status,
                exc.reason,
            )
            return
        logger.info(
            "NetworkPolicy %s/%s admits only the job's pods to its workers",
            self._namespace,
            policy["metadata"]["name"],
        )
