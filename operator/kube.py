"""The Kubernetes API calls the operator makes: pods, Secrets, ConfigMaps, Events, the
ElasticJob's status, PodDisruptionBudgets, webhook configurations and the jobs themselves
(those of leading, the Lease and the rendezvous Service's EndpointSlice, in ``kube_leading.py``).

Every call travels through a :class:`~elasticjob.operator.kube_transport.KubeTransport`
(bounded, retried); an object is created or updated with
:func:`~elasticjob.operator.kube_transport.upsert`; what an error means is ``kube_errors``'s.
"""

from __future__ import annotations

import base64
import datetime
import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import kubernetes
from kubernetes.client.exceptions import ApiException

from elasticjob.operator.api import GROUP, KIND, PLURAL, VERSION
from elasticjob.operator.kube_errors import ApiOutcome, api_outcome
from elasticjob.operator.kube_leading import LeadingCalls
from elasticjob.operator.kube_transport import REQUEST_TIMEOUT_S, KubeTransport, upsert

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PodList:
    """Pods as listed, and the list's ``metadata.resourceVersion`` (the moment it shows)."""

    items: list[dict[str, Any]]
    resource_version: str | None


def secret_value(secret: dict[str, Any], key: str) -> str | None:
    """The decoded value of ``key`` in a Secret as the API returns it."""
    data = secret.get("data") or {}
    return base64.b64decode(data[key]).decode() if key in data else None


class KubeApi(LeadingCalls):
    """The few API calls the operator makes (those of leading: :class:`LeadingCalls`)."""

    def __init__(self, transport: KubeTransport | None = None) -> None:
        self._transport = transport or KubeTransport()
        client = self._transport.client
        self.core = kubernetes.client.CoreV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.rbac = kubernetes.client.RbacAuthorizationV1Api(client)
        self.admission = kubernetes.client.AdmissionregistrationV1Api(client)
        self.coordination = kubernetes.client.CoordinationV1Api(client)
        self._served_versions: dict[str, frozenset[str]] = {}

    async def create_pod(self, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
        """Create ``pod``; the pod as created."""
        return await self._transport.call_json(
            "create pod", self.core.create_namespaced_pod, namespace, pod
        )

    async def list_pods(self, namespace: str, selector: str) -> PodList:
        """The pods in ``namespace`` that ``selector`` (a label selector) selects, from the API
        server's watch cache (``resourceVersion=0``, as informers list): a list served from
        etcd reads and decodes every pod of the namespace to filter them, and each job
        re-lists now and then (``podmap.Resync``). The list may be a little older than the
        newest state; the pod map's merge rules take a list for what it is, by its version
        (``podmap.py``)."""
        found = await self._transport.call_json(
            "list pods",
            self.core.list_namespaced_pod,
            namespace,
            label_selector=selector,
            resource_version="0",
        )
        version = (found.get("metadata") or {}).get("resourceVersion")
        return PodList(list(found.get("items") or []), version)

    async def delete_pod(self, namespace: str, name: str, grace_s: int | None = None) -> None:
        """Delete the pod (done when there is none)."""
        try:
            await self._transport.call_json(
                "delete pod",
                self.core.delete_namespaced_pod,
                name,
                namespace,
                grace_period_seconds=grace_s,
            )
        except ApiException as exc:
            if api_outcome(exc) is not ApiOutcome.NOT_FOUND:
                raise

    async def _read(self, what: str, read: Callable[..., Any], *args: Any) -> dict[str, Any] | None:
        """The object ``read`` returns, serialized, or None when there is none."""
        try:
            return await self._transport.call_json(what, read, *args)
        except ApiException as exc:
            if api_outcome(exc) is ApiOutcome.NOT_FOUND:
                return None
            raise

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod, or None when there is none."""
        return await self._read("read pod", self.core.read_namespaced_pod, name, namespace)

    async def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Secret (``data`` still base64), or None when there is none."""
        return await self._read("read secret", self.core.read_namespaced_secret, name, namespace)

    async def read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ConfigMap, or None when there is none."""
        return await self._read(
            "read config map", self.core.read_namespaced_config_map, name, namespace
        )

    async def apply_config_map(self, namespace: str, config_map: dict[str, Any]) -> None:
        """Set the ``data`` of ``config_map``, creating it if it does not exist (it mostly
        does: one call)."""
        name = config_map["metadata"]["name"]
        call = self._transport.call_json
        await upsert(
            functools.partial(
                call,
                "create config map",
                self.core.create_namespaced_config_map,
                namespace,
                config_map,
            ),
            functools.partial(
                call,
                "patch config map",
                self.core.patch_namespaced_config_map,
                name,
                namespace,
                {"data": config_map["data"]},
            ),
            update_first=True,
        )

    async def label_pod(
        self, namespace: str, name: str, labels: dict[str, str | None], timeout_s: float
    ) -> None:
        """Set (a value) or remove (None) labels of a pod (one try within ``timeout_s``; done
        when there is no such pod)."""
        try:
            await self._transport.call_once(
                "label pod",
                self.core.patch_namespaced_pod,
                name,
                namespace,
                {"metadata": {"labels": labels}},
                timeout_s=timeout_s,
            )
        except ApiException as exc:
            if api_outcome(exc) is not ApiOutcome.NOT_FOUND:
                raise

    async def fill_secret(
        self, namespace: str, name: str, data: Mapping[str, str | None], version: str | None
    ) -> bool:
        """Set keys of a Secret's ``data`` (base64 values, None removes one) if it is still at
        resource ``version`` (None: any); whether it was (False: someone else changed it)."""
        patch: dict[str, Any] = {"data": dict(data)}
        if version is not None:
            patch["metadata"] = {"resourceVersion": version}
        try:
            await self._transport.call_once(
                "fill secret",
                self.core.patch_namespaced_secret,
                name,
                namespace,
                patch,
                timeout_s=REQUEST_TIMEOUT_S,
            )
        except ApiException as exc:
            if api_outcome(exc) is ApiOutcome.CONFLICT:
                return False
            raise
        return True

    async def create_secret(self, namespace: str, secret: dict[str, Any]) -> dict[str, Any] | None:
        """Create ``secret``; the Secret as created, or None when one of its name exists."""
        create = self.core.create_namespaced_secret
        call = self._transport.call_json
        return await upsert(
            functools.partial(call, "create secret", create, namespace, secret), None
        )

    async def list_jobs(self, namespaces: tuple[str, ...]) -> list[dict[str, Any]]:
        """The ElasticJobs in ``namespaces`` (empty: in every namespace)."""
        if not namespaces:
            found: Any = await self._transport.call(
                "list jobs", self.custom.list_cluster_custom_object, GROUP, VERSION, PLURAL
            )
            return list(found["items"])
        jobs: list[dict[str, Any]] = []
        list_in = self.custom.list_namespaced_custom_object
        for namespace in namespaces:
            found = await self._transport.call(
                "list jobs", list_in, GROUP, VERSION, namespace, PLURAL
            )
            jobs.extend(found["items"])
        return jobs

    async def read_job(self, namespace: str, name: str) -> dict[str, Any]:
        """The stored ElasticJob."""
        read = self.custom.get_namespaced_custom_object
        job: Any = await self._transport.call(
            "read job", read, GROUP, VERSION, namespace, PLURAL, name
        )
        return dict(job)

    async def delete_job(self, namespace: str, name: str, uid: str) -> None:
        """Delete the ElasticJob ``name`` if its uid is ``uid`` (done when it is gone, or is
        another job of that name); what it owns goes with it."""
        body = {"preconditions": {"uid": uid}, "propagationPolicy": "Background"}
        delete = self.custom.delete_namespaced_custom_object
        try:
            await self._transport.call_json(
                "delete job", delete, GROUP, VERSION, namespace, PLURAL, name, body=body
            )
        except ApiException as exc:
            if api_outcome(exc) not in (ApiOutcome.NOT_FOUND, ApiOutcome.CONFLICT):
                raise

    async def openapi_v2(self) -> dict[str, Any]:
        """The API server's OpenAPI v2 document (``/openapi/v2``: several megabytes)."""
        return await self._transport.request("read the OpenAPI document", "GET", "/openapi/v2")

    async def served_version(self, candidates: tuple[str, ...]) -> str | None:
        """The first of ``candidates`` (``group/version``, all of one group) the API server
        serves (each group asked once)."""
        name = candidates[0].split("/")[0]
        if name not in self._served_versions:
            try:
                group = await self._transport.request(
                    f"discover the {name} API", "GET", f"/apis/{name}"
                )
            except ApiException as exc:
                if api_outcome(exc) is not ApiOutcome.NOT_FOUND:
                    raise
                group = {}
            served = {v.get("groupVersion") for v in group.get("versions") or []}
            self._served_versions[name] = frozenset(str(v) for v in served if v)
        return next((v for v in candidates if v in self._served_versions[name]), None)

    async def apply_owned(self, namespace: str, obj: dict[str, Any], plural: str) -> None:
        """Create ``obj``, an object of a named API group (``plural``: its resource, such as
        ``poddisruptionbudgets``), or set its spec if it exists."""
        kind = obj["kind"]
        base = f"/apis/{obj['apiVersion']}/namespaces/{namespace}/{plural}"
        request = self._transport.request
        await upsert(
            functools.partial(request, f"create {kind}", "POST", base, obj),
            functools.partial(
                request,
                f"update {kind}",
                "PATCH",
                f"{base}/{obj['metadata']['name']}",
                {"spec": obj["spec"]},
                content_type="application/merge-patch+json",
            ),
        )

    async def cluster_role_uid(self, name: str) -> str:
        """The uid of the ClusterRole ``name``."""
        role = await self._transport.call("read cluster role", self.rbac.read_cluster_role, name)
        assert role.metadata is not None
        return str(role.metadata.uid)

    async def read_validating_webhook_configuration(self, name: str) -> dict[str, Any] | None:
        """The ValidatingWebhookConfiguration ``name``, or None when there is none."""
        return await self._read(
            "read validating webhook configuration",
            self.admission.read_validating_webhook_configuration,
            name,
        )

    async def own_webhook_configurations(self, name: str, owner: dict[str, Any]) -> None:
        """Make ``owner`` the owner of the validating and mutating webhook configurations
        ``name`` (creating them, empty, when missing), so that they are garbage-collected with
        it."""
        body = {"metadata": {"name": name, "ownerReferences": [owner]}}
        admission, call = self.admission, self._transport.call
        for kind, create, patch in (
            (
                "validating",
                admission.create_validating_webhook_configuration,
                admission.patch_validating_webhook_configuration,
            ),
            (
                "mutating",
                admission.create_mutating_webhook_configuration,
                admission.patch_mutating_webhook_configuration,
            ),
        ):
            await upsert(
                functools.partial(call, f"create {kind} webhook configuration", create, body),
                functools.partial(call, f"own {kind} webhook configuration", patch, name, body),
            )

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """Set the ElasticJob's status (the status subresource, merged)."""
        patch = self.custom.patch_namespaced_custom_object_status
        await self._transport.call(
            "patch status", patch, GROUP, VERSION, namespace, PLURAL, name, {"status": status}
        )

    async def event(
        self, namespace: str, job: dict[str, Any], reason: str, message: str, warning: bool = False
    ) -> None:
        """Record an Event on the ElasticJob (best effort: never fails the caller)."""
        involved = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "name": job["metadata"]["name"],
            "namespace": namespace,
            "uid": job["metadata"]["uid"],
        }
        await self._record_event(namespace, involved, reason, message, warning)

    async def lease_event(self, lease: dict[str, Any], reason: str, message: str) -> None:
        """Record an Event on a Lease (best effort: never fails the caller)."""
        metadata = lease["metadata"]
        involved = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "name": metadata["name"],
            "namespace": metadata["namespace"],
            "uid": metadata["uid"],
        }
        await self._record_event(metadata["namespace"], involved, reason, message, False)

    async def _record_event(
        self,
        namespace: str,
        involved: dict[str, Any],
        reason: str,
        message: str,
        warning: bool,
    ) -> None:
        now = datetime.datetime.now(datetime.UTC)
        body = {
            "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "firstTimestamp": now.isoformat(),
            "lastTimestamp": now.isoformat(),
            "count": 1,
            "source": {"component": "elasticjob-operator"},
        }
        try:
            await self._transport.call_json(
                "create event", self.core.create_namespaced_event, namespace, body
            )
        except (ApiException, OSError) as exc:
            logger.warning("could not record event %s: %s", reason, exc)
