"""KubeApi.list_pods: the client's models come back as the API's dicts, decoded off the loop."""

from __future__ import annotations

import threading
from typing import Any

import kubernetes
import pytest

from elasticjob.operator.kube import KubeApi

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "train-worker-1",
        "namespace": "ml",
        "resourceVersion": "7",
        "creationTimestamp": "2026-11-25T10:00:00Z",
        "labels": {"elasticjob.dev/job-name": "train"},
    },
    "spec": {"containers": [{"name": "worker", "image": "img"}], "nodeName": "n1"},
    "status": {"phase": "Running", "podIP": "10.1.0.1"},
}


async def test_listed_pods_are_dicts_in_the_apis_names_made_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = kubernetes.client.ApiClient()
    body = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "9"}}
    answer = client._ApiClient__deserialize(body | {"items": [POD]}, "V1PodList")  # type: ignore[attr-defined]
    loop_thread = threading.current_thread()
    serialized_in: list[threading.Thread] = []
    sanitize = kubernetes.client.ApiClient.sanitize_for_serialization

    def recording_sanitize(self: Any, obj: Any) -> Any:
        serialized_in.append(threading.current_thread())
        return sanitize(self, obj)

    monkeypatch.setattr(
        kubernetes.client.ApiClient, "sanitize_for_serialization", recording_sanitize
    )
    api = KubeApi()
    calls: list[tuple[Any, ...]] = []

    def list_namespaced_pod(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs["label_selector"]))
        return answer

    monkeypatch.setattr(api.core, "list_namespaced_pod", list_namespaced_pod)
    listed = await api.list_pods("ml", "elasticjob.dev/job-name=train")
    assert calls == [(("ml",), "elasticjob.dev/job-name=train")]
    assert listed.resource_version == "9"
    (pod,) = listed.items
    assert pod["metadata"]["name"] == "train-worker-1"
    assert pod["metadata"]["creationTimestamp"] == "2026-11-25T10:00:00+00:00"
    assert pod["status"] == {"phase": "Running", "podIP": "10.1.0.1"}
    assert pod["spec"]["nodeName"] == "n1"
    assert serialized_in and loop_thread not in serialized_in
