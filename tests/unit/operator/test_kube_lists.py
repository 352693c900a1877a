"""KubeApi.list_pods and create_pod: the API server's JSON as dicts, without the client's
models, decoded off the event loop."""

from __future__ import annotations

import io
import json
import threading
from typing import Any

import pytest
import urllib3

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


class Answer(urllib3.HTTPResponse):
    """An answer as the client returns it with ``_preload_content=False``, recording the
    thread that reads it."""

    def __init__(self, document: dict[str, Any]) -> None:
        super().__init__(io.BytesIO(json.dumps(document).encode()), status=200,
                         preload_content=False)  # fmt: skip
        self.read_in: list[threading.Thread] = []

    def read(self, *args: Any, **kwargs: Any) -> bytes:
        self.read_in.append(threading.current_thread())
        return super().read(*args, **kwargs)


async def test_listed_pods_are_the_servers_json_decoded_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answer = Answer({"kind": "PodList", "metadata": {"resourceVersion": "9"}, "items": [POD]})
    api = KubeApi()
    calls: list[tuple[Any, ...]] = []

    def list_namespaced_pod(*args: Any, **kwargs: Any) -> Any:
        calls.append(
            (args, kwargs["label_selector"], kwargs["resource_version"], kwargs["_preload_content"])
        )
        return answer

    monkeypatch.setattr(api.core, "list_namespaced_pod", list_namespaced_pod)
    listed = await api.list_pods("ml", "elasticjob.dev/job-name=train")
    # resourceVersion 0: from the API server's watch cache, not a read of every pod from etcd
    assert calls == [(("ml",), "elasticjob.dev/job-name=train", "0", False)]
    assert listed.resource_version == "9"
    assert listed.items == [POD]  # timestamps as the server wrote them, as in watch events
    assert answer.read_in and threading.current_thread() not in answer.read_in


async def test_a_created_pod_is_the_servers_json(monkeypatch: pytest.MonkeyPatch) -> None:
    api = KubeApi()
    sent: list[Any] = []

    def create_namespaced_pod(namespace: str, pod: dict[str, Any], **kwargs: Any) -> Any:
        sent.append((namespace, pod, kwargs["_preload_content"]))
        return Answer(POD)

    monkeypatch.setattr(api.core, "create_namespaced_pod", create_namespaced_pod)
    manifest = {"metadata": {"generateName": "train-worker-"}}
    assert await api.create_pod("ml", manifest) == POD
    assert sent == [("ml", manifest, False)]
