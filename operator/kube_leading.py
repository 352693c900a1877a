"""The API calls of leading: the Lease the replicas elect their leader with, and the
EndpointSlice of the rendezvous Service that routes the workers to the leader
(``service_route.py``). Each is one try within a deadline: the election and the route retry
on their own schedule, and a write at a ``resourceVersion`` that conflicts must not be tried
again as it was."""

from __future__ import annotations

import asyncio
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

from elasticjob.operator.kube_errors import ApiOutcome, api_outcome
from elasticjob.operator.kube_transport import KubeTransport


class LeadingCalls:
    """The calls of leading, a part of :class:`~elasticjob.operator.kube.KubeApi`."""

    _transport: KubeTransport
    coordination: kubernetes.client.CoordinationV1Api

    async def read_lease(
        self, namespace: str, name: str, timeout_s: float
    ) -> dict[str, Any] | None:
        """The Lease (one try within ``timeout_s``), or None when there is none."""
        try:
            return await self._transport.call_once(
                "read lease",
                self.coordination.read_namespaced_lease,
                name,
                namespace,
                timeout_s=timeout_s,
            )
        except ApiException as exc:
            if api_outcome(exc) is ApiOutcome.NOT_FOUND:
                return None
            raise

    async def write_lease(
        self, namespace: str, lease: dict[str, Any], timeout_s: float
    ) -> dict[str, Any]:
        """Create ``lease`` (no ``metadata.resourceVersion``) or replace it at its
        ``resourceVersion`` (one try within ``timeout_s``: a conflict raises, someone else
        wrote first); the Lease as written."""
        name = lease["metadata"]["name"]
        if lease["metadata"].get("resourceVersion"):
            return await self._transport.call_once(
                "replace lease",
                self.coordination.replace_namespaced_lease,
                name,
                namespace,
                lease,
                timeout_s=timeout_s,
            )
        return await self._transport.call_once(
            "create lease",
            self.coordination.create_namespaced_lease,
            namespace,
            lease,
            timeout_s=timeout_s,
        )

    async def read_endpoint_slice(
        self, namespace: str, name: str, version: str, timeout_s: float
    ) -> dict[str, Any] | None:
        """The EndpointSlice of API ``version`` (``discovery.k8s.io/v1`` or ``v1beta1``; one
        try within ``timeout_s``), or None when there is none."""
        path = f"/apis/{version}/namespaces/{namespace}/endpointslices/{name}"
        try:
            async with asyncio.timeout(timeout_s):
                return await self._transport.request("read endpoint slice", "GET", path)
        except ApiException as exc:
            if api_outcome(exc) is ApiOutcome.NOT_FOUND:
                return None
            raise

    async def write_endpoint_slice(
        self, namespace: str, endpoint_slice: dict[str, Any], timeout_s: float
    ) -> bool:
        """Create ``endpoint_slice`` (no ``metadata.resourceVersion``) or replace it at its
        ``resourceVersion`` (one try within ``timeout_s``); whether it was written (False:
        someone else made or changed it first)."""
        collection = f"/apis/{endpoint_slice['apiVersion']}/namespaces/{namespace}/endpointslices"
        name = endpoint_slice["metadata"]["name"]
        replace = bool(endpoint_slice["metadata"].get("resourceVersion"))
        method, path = ("PUT", f"{collection}/{name}") if replace else ("POST", collection)
        try:
            async with asyncio.timeout(timeout_s):
                await self._transport.request("write endpoint slice", method, path, endpoint_slice)
        except ApiException as exc:
            if api_outcome(exc) in (ApiOutcome.CONFLICT, ApiOutcome.ALREADY_EXISTS):
                return False
            raise
        return True
