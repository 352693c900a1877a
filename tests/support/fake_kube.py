"""An in-memory Kubernetes API for the operator's unit tests: the calls of
``elasticjob.operator.kube.KubeApi`` a job's controller makes, over objects kept in memory with
resourceVersions and uids as the API server gives them, and a
watch that pushes each pod change to the controllers subscribed to it (as kopf does).

The test plays the rest of the cluster: the scheduler and the kubelets
(:meth:`FakeKube.run_pod`, :meth:`FakeKube.end_pod`), and whoever deletes a pod behind the
operator's back (:meth:`FakeKube.remove_pod`). Every change wakes
:meth:`FakeKube.wait_for`, so tests await what they expect with a deadline, never a sleep.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from kubernetes.client.exceptions import ApiException

from elasticjob.operator.kube import PodList

T = TypeVar("T")

PodWatcher = Callable[[str, dict[str, Any]], None]
"""Told each pod change: the event type (ADDED, MODIFIED, DELETED) and the pod."""


@dataclass(frozen=True)
class PostedEvent:
    """A Kubernetes event the operator posted on an object."""

    reason: str
    message: str
    warning: bool


@dataclass(frozen=True)
class Deletion:
    """A pod the operator deleted, with the grace period it asked for."""

    name: str
    grace_s: int | None


class FakeKube:
    """The objects of one namespace and what the operator did to them."""

    def __init__(self, namespace: str = "ns") -> None:
        self.namespace = namespace
        self.pods: dict[str, dict[str, Any]] = {}
        self.secrets: dict[str, dict[str, Any]] = {}
        self.config_maps: dict[str, dict[str, Any]] = {}
        self.budgets: dict[str, dict[str, Any]] = {}
        self.network_policies: dict[str, dict[str, Any]] = {}
        self.statuses: list[dict[str, Any]] = []
        """Every status the operator wrote, oldest first."""
        self.events: list[PostedEvent] = []
        self.deletions: list[Deletion] = []
        self.created: list[str] = []
        """The names of the pods the operator created, in order."""
        self._versions = itertools.count(100)
        self._watchers: list[PodWatcher] = []
        self._changed = asyncio.Condition()

    # ---- what the test uses ------------------------------------------------------------

    def watch_pods(self, watcher: PodWatcher) -> None:
        """Push every later pod change to ``watcher``."""
        self._watchers.append(watcher)

    async def wait_for(self, what: Callable[[], T | None], deadline_s: float = 5.0) -> T:
        """Wait until ``what()`` is truthy (re-checked at every change); return its value.
        Raises ``TimeoutError`` after ``deadline_s``."""

        async def satisfied() -> T:
            async with self._changed:
                while not (value := what()):
                    await self._changed.wait()
                return value

        return await asyncio.wait_for(satisfied(), deadline_s)

    def event_reasons(self) -> list[str]:
        return [event.reason for event in self.events]

    def run_pod(self, name: str, node: str, ip: str = "10.0.0.1") -> None:
        """The scheduler placed the pod on ``node`` and its kubelet started it."""
        self._update(name, spec={"nodeName": node}, status={"phase": "Running", "podIP": ip})

    def end_pod(self, name: str, exit_code: int) -> None:
        """The pod's worker container exited with ``exit_code``."""
        terminated = {"state": {"terminated": {"exitCode": exit_code}}}
        phase = "Succeeded" if exit_code == 0 else "Failed"
        self._update(name, status={"phase": phase, "containerStatuses": [terminated]})

    def remove_pod(self, name: str) -> None:
        """Someone else deleted the pod, and it is gone."""
        pod = self.pods.pop(name)
        pod["metadata"]["resourceVersion"] = str(next(self._versions))
        self._push("DELETED", pod)

    def add_pod(self, pod: dict[str, Any]) -> None:
        """A pod that exists already (made before the operator under test started)."""
        added = copy.deepcopy(pod)
        name = added["metadata"]["name"]
        added["metadata"].update(
            namespace=self.namespace,
            uid=f"uid-{name}",
            resourceVersion=str(next(self._versions)),
            creationTimestamp="2025-12-31T00:00:00Z",
        )
        added.setdefault("status", {"phase": "Pending"})
        self.pods[name] = added

    def job_body(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        """An ElasticJob as the API server returns it (new: no status)."""
        return {
            "apiVersion": "elasticjob.dev/v1alpha1",
            "kind": "ElasticJob",
            "metadata": {"name": name, "namespace": self.namespace, "uid": f"uid-{name}"},
            "spec": spec,
        }

    def _update(self, name: str, **parts: dict[str, Any]) -> None:
        pod = self.pods[name]
        for part, fields in parts.items():
            pod.setdefault(part, {}).update(fields)
        pod["metadata"]["resourceVersion"] = str(next(self._versions))
        self._push("MODIFIED", pod)

    def _push(self, event_type: str, pod: dict[str, Any]) -> None:
        for watcher in self._watchers:
            watcher(event_type, copy.deepcopy(pod))
        self._notify()

    def _notify(self) -> None:
        async def notify() -> None:
            async with self._changed:
                self._changed.notify_all()

        asyncio.get_running_loop().create_task(notify())

    # ---- the KubeApi calls the operator makes ------------------------------------------

    async def create_pod(self, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
        created = copy.deepcopy(pod)
        metadata = created["metadata"]
        name = metadata["name"]
        if name in self.pods:
            raise ApiException(status=409, reason="AlreadyExists")
        metadata.update(
            namespace=namespace,
            uid=f"uid-{name}",
            resourceVersion=str(next(self._versions)),
            creationTimestamp=f"2026-01-01T00:00:{len(self.pods):02d}Z",
        )
        created["status"] = {"phase": "Pending"}
        self.pods[name] = created
        self.created.append(name)
        self._push("ADDED", created)
        return copy.deepcopy(created)

    async def list_pods(self, namespace: str, selector: str) -> PodList:
        del selector  # every pod of the fake belongs to the job under test
        pods = [copy.deepcopy(p) for p in self.pods.values()]
        return PodList(pods, str(next(self._versions)))

    async def delete_pod(self, namespace: str, name: str, grace_s: int | None = None) -> None:
        self.deletions.append(Deletion(name, grace_s))
        if name in self.pods:
            self.remove_pod(name)
        else:
            self._notify()

    async def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.secrets.get(name))

    async def create_secret(self, namespace: str, secret: dict[str, Any]) -> dict[str, Any] | None:
        name = secret["metadata"]["name"]
        if name in self.secrets:
            return None
        stored = copy.deepcopy(secret)
        stored["data"] = {k: _base64(v) for k, v in stored.pop("stringData", {}).items()}
        self.secrets[name] = stored
        return copy.deepcopy(stored)

    async def fill_secret(
        self, namespace: str, name: str, data: dict[str, str | None], version: str | None
    ) -> bool:
        stored = self.secrets[name]
        if version is not None and version != stored["metadata"].get("resourceVersion"):
            return False
        for key, value in data.items():
            if value is None:
                stored["data"].pop(key, None)
            else:
                stored["data"][key] = value
        self._notify()
        return True

    async def read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.config_maps.get(name))

    async def apply_config_map(self, namespace: str, config_map: dict[str, Any]) -> None:
        self.config_maps[config_map["metadata"]["name"]] = copy.deepcopy(config_map)
        self._notify()

    async def served_version(self, candidates: tuple[str, ...]) -> str | None:
        return candidates[0]

    async def apply_owned(self, namespace: str, obj: dict[str, Any], plural: str) -> None:
        kept = self.budgets if plural == "poddisruptionbudgets" else self.network_policies
        kept[obj["metadata"]["name"]] = copy.deepcopy(obj)

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.statuses.append(copy.deepcopy(status))
        self._notify()

    async def event(
        self,
        namespace: str,
        obj: dict[str, Any],
        reason: str,
        message: str,
        warning: bool = False,
    ) -> None:
        self.events.append(PostedEvent(reason, message, warning))
        self._notify()


def _base64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()
