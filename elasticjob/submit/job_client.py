"""The API calls of ``elasticjob submit``, ``status``, ``logs`` and ``delete``: a client made from
a kubeconfig as kubectl makes it (``--kubeconfig``, ``$KUBECONFIG``, ``~/.kube/config``, or the
pod's service account inside a cluster), the context's namespace by default."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import kubernetes
from kubernetes.client.exceptions import ApiException

from elasticjob.operator.api import GROUP, PLURAL, VERSION, WORKER_CONTAINER
from elasticjob.operator.kube_errors import ApiOutcome, api_outcome

logger = logging.getLogger(__name__)


class JobNotFoundError(LookupError):
    """No ElasticJob of that name in the namespace."""


@dataclass(frozen=True)
class JobClient:
    """Calls on the ElasticJobs of one namespace."""

    api: kubernetes.client.ApiClient
    namespace: str

    @classmethod
    def connect(
        cls,
        kubeconfig: str | None = None,
        context: str | None = None,
        namespace: str | None = None,
    ) -> JobClient:
        """A client as kubectl's: the kubeconfig and context given, or the defaults; inside a
        pod without a kubeconfig, its service account (and its namespace)."""
        config = kubernetes.client.Configuration()
        try:
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, client_configuration=config
            )
            contexts, active = kubernetes.config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
                kubeconfig
            )
            chosen = next((c for c in contexts if c["name"] == context), active)
            default_ns = (chosen or {}).get("context", {}).get("namespace") or "default"
        except kubernetes.config.ConfigException:
            if kubeconfig is not None or context is not None:
                raise
            kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=config
            )
            default_ns = _service_account_namespace()
        return cls(kubernetes.client.ApiClient(config), namespace or default_ns)

    @property
    def _custom(self) -> kubernetes.client.CustomObjectsApi:
        return kubernetes.client.CustomObjectsApi(self.api)

    @property
    def core(self) -> kubernetes.client.CoreV1Api:
        return kubernetes.client.CoreV1Api(self.api)

    def create(self, job: dict[str, Any], config_map: dict[str, Any]) -> dict[str, Any]:
        """Create the code's ConfigMap, then the job, then make the job the ConfigMap's owner
        (it is deleted with the job). A job refused takes its ConfigMap back."""
        ns = self.namespace
        self.core.create_namespaced_config_map(ns, config_map)  # type: ignore[arg-type]
        name = config_map["metadata"]["name"]
        try:
            created = cast(
                dict[str, Any],
                self._custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, job),
            )
        except ApiException:
            self.core.delete_namespaced_config_map(name, ns)
            raise
        metadata = created["metadata"]
        owner = {
            "apiVersion": created["apiVersion"],
            "kind": created["kind"],
            "name": metadata["name"],
            "uid": metadata["uid"],
            "controller": False,
            "blockOwnerDeletion": False,
        }
        self.core.patch_namespaced_config_map(name, ns, {"metadata": {"ownerReferences": [owner]}})
        return created

    def read(self, name: str) -> dict[str, Any]:
        """The ElasticJob ``name``; raises :class:`JobNotFoundError`."""
        try:
            job = cast(
                dict[str, Any],
                self._custom.get_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, PLURAL, name
                ),
            )
        except ApiException as exc:
            if api_outcome(exc) is ApiOutcome.NOT_FOUND:
                raise self._not_found(name) from None
            raise
        return job

    def watch(self, name: str, timeout_s: int) -> Iterator[tuple[str, dict[str, Any]]]:
        """The job's watch events, ``(type, object)``, for at most ``timeout_s``; the first is
        its current state (an ``ADDED``)."""
        stream = kubernetes.watch.Watch().stream(  # type: ignore[no-untyped-call]
            self._custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            PLURAL,
            field_selector=f"metadata.name={name}",
            timeout_seconds=timeout_s,
        )
        for event in stream:
            yield str(event["type"]), dict(event["object"])

    def delete(self, name: str) -> None:
        """Delete the job (its pods and code go with it); raises :class:`JobNotFoundError`."""
        try:
            self._custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name, propagation_policy="Background"
            )
        except ApiException as exc:
            if api_outcome(exc) is ApiOutcome.NOT_FOUND:
                raise self._not_found(name) from None
            raise

    def _not_found(self, name: str) -> JobNotFoundError:
        return JobNotFoundError(f"no ElasticJob {name} in {self.namespace}")

    def log_lines(
        self, pod: str, *, follow: bool, since_s: int | None = None
    ) -> tuple[Iterator[str], Any]:
        """The worker container's log lines, and the response (close it to stop following)."""
        response = self.core.read_namespaced_pod_log(
            pod,
            self.namespace,
            container=WORKER_CONTAINER,
            follow=follow,
            since_seconds=since_s,
            _preload_content=False,
        )
        return _lines(response), response


def _lines(response: Any) -> Iterator[str]:
    pending = b""
    for chunk in response.stream(amt=4096):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.decode(errors="replace")
    if pending:
        yield pending.decode(errors="replace")


def _service_account_namespace() -> str:
    path = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"
