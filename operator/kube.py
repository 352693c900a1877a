"""Bounded, retried Kubernetes API calls for the operator.

The official client is synchronous; every call runs in a thread of the API's own pool
(:data:`API_THREADS`) with a request timeout and is retried with exponential backoff when the
cause is transient (connection errors, 429, 5xx), so a handler never waits kopf's default 60 s
for a hiccup.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import datetime
import functools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import kubernetes
from kubernetes.client.exceptions import ApiException

from elasticjob.operator.api import GROUP, KIND, PLURAL, VERSION

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
_TRANSIENT = {408, 409, 429, 500, 502, 503, 504}
REQUEST_TIMEOUT_S = 10.0
API_THREADS = 32
"""Calls in flight at once (threads, and connections to the API server). A call holds its
thread for its whole round trip: with asyncio's default pool (as many threads as cores + 4)
a few hundred jobs' calls queued behind each other for seconds on a loaded API server."""


_REFUSALS = {400, 403, 404, 409, 413, 422}


@dataclass(frozen=True)
class PodList:
    """Pods as listed, and the list's ``metadata.resourceVersion`` (the moment it shows)."""

    items: list[dict[str, Any]]
    resource_version: str | None


def _status_of(exc: ApiException) -> dict[str, Any]:
    """The ``Status`` object the API server answered with (empty when there is none)."""
    try:
        status = json.loads(exc.body or "")
    except ValueError:
        status = None
    return status if isinstance(status, dict) else {}


def already_exists(exc: ApiException) -> bool:
    """Whether ``exc`` says that the object to create exists (a 409 no retry changes, unlike
    the 409 of an update that conflicted)."""
    return exc.status == 409 and _status_of(exc).get("reason") == "AlreadyExists"


def refusal(exc: ApiException) -> str | None:
    """The API server's message, quoted, when ``exc`` refuses a request for good (a 4xx
    that no retry changes: the object is invalid, forbidden, too large...), else None. An
    exceeded quota or an object that already exists is not a refusal."""
    if exc.status not in _REFUSALS:
        return None
    status = _status_of(exc)
    message = str(status.get("message") or exc.reason or f"HTTP {exc.status}")
    if already_exists(exc):
        return None
    if exc.status == 403 and "exceeded quota" in message:
        return None
    return f"the API server refused the job's objects ({exc.status}): {message}"


def secret_value(secret: dict[str, Any], key: str) -> str | None:
    """The decoded value of ``key`` in a Secret as the API returns it."""
    data = secret.get("data") or {}
    return base64.b64decode(data[key]).decode() if key in data else None


def json_of(response: Any) -> dict[str, Any]:
    """The JSON object of a raw answer (a call made with ``_preload_content=False``).

    The operator's calls for each job (its pods listed, created, read and deleted, its
    events) skip the client's models: decoding a 200-pod list into them costs about 157 ms
    of CPU and turning them back into dicts about 149 ms, against 15 ms for ``json.loads``
    (``bench/kube_decode.py``); the answer is the same JSON a watch event carries (timestamps
    as the API server writes them)."""
    try:
        document: dict[str, Any] = json.loads(response.data)
    finally:
        response.release_conn()
    return document


def load_config() -> None:
    """In-cluster config when running in a pod, else the local kubeconfig."""
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()


class KubeApi:
    """The few API calls the operator makes."""

    def __init__(self, attempts: int = 5, threads: int = API_THREADS) -> None:
        configuration = kubernetes.client.Configuration.get_default_copy()
        configuration.connection_pool_maxsize = threads
        client = kubernetes.client.ApiClient(configuration)
        self.core = kubernetes.client.CoreV1Api(client)
        self.custom = kubernetes.client.CustomObjectsApi(client)
        self.rbac = kubernetes.client.RbacAuthorizationV1Api(client)
        self.admission = kubernetes.client.AdmissionregistrationV1Api(client)
        self._threads = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="kube")
        self._attempts = attempts
        self._policy_versions: frozenset[str] | None = None

    async def _call(self, what: str, call: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        delay = 0.2
        for attempt in range(1, self._attempts + 1):
            try:
                return await asyncio.get_running_loop().run_in_executor(
                    self._threads,
                    functools.partial(call, *args, _request_timeout=REQUEST_TIMEOUT_S, **kwargs),
                )
            except ApiException as exc:
                if exc.status not in _TRANSIENT or already_exists(exc):
                    raise
                if attempt == self._attempts:
                    raise
                logger.warning("%s: %s %s; retrying", what, exc.status, exc.reason)
            except OSError as exc:  # connection refused/reset, timeouts
                if attempt == self._attempts:
                    raise
                logger.warning("%s: %s; retrying", what, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")

    async def _call_json(
        self, what: str, call: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> dict[str, Any]:
        """:meth:`_call` for the API server's JSON, decoded in the call's thread without the
        client's models (see :func:`json_of`)."""

        def raw(*args: Any, **kwargs: Any) -> dict[str, Any]:
            return json_of(call(*args, _preload_content=False, **kwargs))

        return await self._call(what, raw, *args, **kwargs)

    async def create_pod(self, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
        """Create ``pod``; the pod as created."""
        return await self._call_json("create pod", self.core.create_namespaced_pod, namespace, pod)

    async def list_pods(self, namespace: str, selector: str) -> PodList:
        """The pods in ``namespace`` that ``selector`` (a label selector) selects, from the API
        server's watch cache (``resourceVersion=0``, as informers list): a list served from
        etcd reads and decodes every pod of the namespace to filter them, and each job
        re-lists now and then (``podmap.Resync``). The list may be a little older than the
        newest state; the pod map's merge rules take a list for what it is, by its version
        (``podmap.py``)."""
        found = await self._call_json(
            "list pods",
            self.core.list_namespaced_pod,
            namespace,
            label_selector=selector,
            resource_version="0",
        )
        version = (found.get("metadata") or {}).get("resourceVersion")
        return PodList(list(found.get("items") or []), version)

    async def delete_pod(self, namespace: str, name: str, grace_s: int | None = None) -> None:
        try:
            await self._call_json(
                "delete pod",
                self.core.delete_namespaced_pod,
                name,
                namespace,
                grace_period_seconds=grace_s,
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def _read(self, what: str, read: Callable[..., Any], *args: Any) -> dict[str, Any] | None:
        """The object ``read`` returns, serialized, or None when there is none (404)."""
        try:
            return await self._call_json(what, read, *args)
        except ApiException as exc:
            if exc.status == 404:
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

        async def patch() -> None:
            await self._call_json(
                "patch config map",
                self.core.patch_namespaced_config_map,
                config_map["metadata"]["name"],
                namespace,
                {"data": config_map["data"]},
            )

        try:
            await patch()
            return
        except ApiException as exc:
            if exc.status != 404:
                raise
        try:
            await self._call_json(
                "create config map", self.core.create_namespaced_config_map, namespace, config_map
            )
        except ApiException as exc:
            if not already_exists(exc):
                raise
            await patch()  # created in between

    async def read_secret_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """A Secret's ``data`` (base64 values), or None if there is no such Secret."""
        secret = await self.read_secret(namespace, name)
        return None if secret is None else dict(secret.get("data") or {})

    async def patch_secret_data(self, namespace: str, name: str, data: dict[str, str]) -> None:
        """Set keys of a Secret's ``data`` (base64 values)."""
        await self._call(
            "patch secret", self.core.patch_namespaced_secret, name, namespace, {"data": data}
        )

    async def create_secret(self, namespace: str, secret: dict[str, Any]) -> dict[str, Any] | None:
        """Create ``secret``; the Secret as created, or None when one of its name exists."""
        try:
            return await self._call_json(
                "create secret", self.core.create_namespaced_secret, namespace, secret
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
            return None

    async def list_jobs(self, namespaces: tuple[str, ...]) -> list[dict[str, Any]]:
        """The ElasticJobs in ``namespaces`` (empty: in every namespace)."""
        if not namespaces:
            found: Any = await self._call(
                "list jobs", self.custom.list_cluster_custom_object, GROUP, VERSION, PLURAL
            )
            return list(found["items"])
        jobs: list[dict[str, Any]] = []
        for namespace in namespaces:
            found = await self._call(
                "list jobs",
                self.custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                namespace,
                PLURAL,
            )
            jobs.extend(found["items"])
        return jobs

    async def read_job(self, namespace: str, name: str) -> dict[str, Any]:
        """The stored ElasticJob."""
        job: Any = await self._call(
            "read job",
            self.custom.get_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
        )
        return dict(job)

    async def _raw(
        self,
        what: str,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """``method path`` as JSON, for APIs the client has no models of (an answer of 400
        or more raises :class:`ApiException`)."""
        client = self.core.api_client
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        method, url, headers, serialized, post = client.param_serialize(
            method, path, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        response = await self._call(
            what,
            client.call_api,
            method,
            url,
            header_params=headers,
            body=serialized,
            post_params=post,
        )
        data = response.read()
        if not 200 <= response.status < 300:
            raise ApiException(status=response.status, reason=response.reason, http_resp=response)
        document: dict[str, Any] = json.loads(data) if data else {}
        return document

    async def openapi_v2(self) -> dict[str, Any]:
        """The API server's OpenAPI v2 document (``/openapi/v2``: several megabytes)."""
        return await self._raw("read the OpenAPI document", "GET", "/openapi/v2")

    async def policy_version(self, candidates: tuple[str, ...]) -> str | None:
        """The first of ``candidates`` (``group/version``) the API server serves (asked once)."""
        if self._policy_versions is None:
            try:
                group = await self._raw("discover the policy API", "GET", "/apis/policy")
            except ApiException as exc:
                if exc.status != 404:
                    raise
                group = {}
            served = {v.get("groupVersion") for v in group.get("versions") or []}
            self._policy_versions = frozenset(str(v) for v in served if v)
        return next((v for v in candidates if v in self._policy_versions), None)

    async def apply_disruption_budget(self, namespace: str, budget: dict[str, Any]) -> None:
        """Create ``budget`` (a PodDisruptionBudget), or set its spec if it exists."""
        base = f"/apis/{budget['apiVersion']}/namespaces/{namespace}/poddisruptionbudgets"
        try:
            await self._raw("create PodDisruptionBudget", "POST", base, budget)
        except ApiException as exc:
            if exc.status != 409:
                raise
            await self._raw(
                "update PodDisruptionBudget",
                "PATCH",
                f"{base}/{budget['metadata']['name']}",
                {"spec": budget["spec"]},
                content_type="application/merge-patch+json",
            )

    async def cluster_role_uid(self, name: str) -> str:
        """The uid of the ClusterRole ``name``."""
        role = await self._call("read cluster role", self.rbac.read_cluster_role, name)
        assert role.metadata is not None
        return str(role.metadata.uid)

    async def own_webhook_configurations(self, name: str, owner: dict[str, Any]) -> None:
        """Make ``owner`` the owner of the validating and mutating webhook configurations
        ``name`` (creating them, empty, when missing), so that they are garbage-collected with
        it."""
        body = {"metadata": {"name": name, "ownerReferences": [owner]}}
        admission = self.admission
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
            try:
                await self._call(f"create {kind} webhook configuration", create, body)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                await self._call(f"own {kind} webhook configuration", patch, name, body)

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        await self._call(
            "patch status",
            self.custom.patch_namespaced_custom_object_status,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            name,
            {"status": status},
        )

    async def event(
        self, namespace: str, job: dict[str, Any], reason: str, message: str, warning: bool = False
    ) -> None:
        """Record an Event on the ElasticJob (best effort: never fails the caller)."""
        now = datetime.datetime.now(datetime.UTC)
        body = {
            "metadata": {"generateName": f"{job['metadata']['name']}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": KIND,
                "name": job["metadata"]["name"],
                "namespace": namespace,
                "uid": job["metadata"]["uid"],
            },
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "firstTimestamp": now.isoformat(),
            "lastTimestamp": now.isoformat(),
            "count": 1,
            "source": {"component": "elasticjob-operator"},
        }
        try:
            await self._call_json(
                "create event", self.core.create_namespaced_event, namespace, body
            )
        except (ApiException, OSError) as exc:
            logger.warning("could not record event %s: %s", reason, exc)
