"""What the Kubernetes client's models cost the operator's event loop (prints its figures;
asserts nothing).

The operator lists a job's pods with the Kubernetes client (``KubeApi.list_pods``): the
answer is decoded into ``V1PodList`` models in a worker thread, then turned back into dicts
(on the event loop, which also serves the rendezvous of every job, until this benchmark was
written; in the thread since). This measures, for lists of worker pods as the API server
answers them (the operator's manifest, the server's defaults, managed fields and a running
status):

1. the CPU of each step: ``json.loads`` of the body, decoding into models, turning the
   models back into dicts;
2. how late a 1 ms timer on the event loop fires while the list is decoded in a thread, as
   the operator does (the thread holds the GIL), against decoding raw JSON only.

Usage: python bench/kube_decode.py [--pods 200] [--repeat 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kubernetes.client import ApiClient  # noqa: E402

from elasticjob.operator.api import parse_spec  # noqa: E402
from elasticjob.operator.pods import worker_pod  # noqa: E402
from tests.support.crd_model import with_changes  # noqa: E402

JOB = {"metadata": {"name": "train", "namespace": "ml", "uid": "6d1c7d3e-uid"}}
WORKER = {"name": "worker", "image": "registry.example/train:1", "command": ["python", "train.py"]}


def served_pod(index: int) -> dict[str, Any]:
    """A worker pod as the API server lists it: the operator's manifest with the server's
    defaults, managed fields and a running status."""
    template = {"metadata": {"labels": {"team": "a"}}, "spec": {"containers": [WORKER]}}
    pod = worker_pod(
        JOB, parse_spec(with_changes(template=template)), rendezvous_url="https://r:8470"
    )
    name = f"train-worker-{index:05x}"
    stamp = "2026-11-25T10:00:00Z"
    meta = pod["metadata"]
    meta.update(name=name, namespace="ml", uid=f"uid-{index}", resourceVersion=str(1000 + index),
                creationTimestamp=stamp)  # fmt: skip
    meta["managedFields"] = [
        {"manager": "kopf", "operation": "Update", "apiVersion": "v1", "time": stamp,
         "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": {"f:team": {}}}}},
        {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": stamp,
         "fieldsType": "FieldsV1", "subresource": "status",
         "fieldsV1": {"f:status": {"f:conditions": {}, "f:phase": {}, "f:podIP": {}}}},
    ]  # fmt: skip
    spec = pod["spec"]
    spec.update(nodeName=f"node-{index % 50}", dnsPolicy="ClusterFirst",
                schedulerName="default-scheduler", serviceAccountName="default",
                terminationGracePeriodSeconds=30, securityContext={}, enableServiceLinks=True,
                preemptionPolicy="PreemptLowerPriority", priority=0)  # fmt: skip
    spec["tolerations"] = [
        {"key": f"node.kubernetes.io/{what}", "operator": "Exists", "effect": "NoExecute",
         "tolerationSeconds": 300} for what in ("not-ready", "unreachable")
    ]  # fmt: skip
    spec["volumes"] = [{"name": "kube-api-access", "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
    ]}}]  # fmt: skip
    for container in spec["containers"]:
        container.update(imagePullPolicy="IfNotPresent", resources={},
                         terminationMessagePath="/dev/termination-log",
                         terminationMessagePolicy="File")  # fmt: skip
        mount = "/var/run/secrets/kubernetes.io/serviceaccount"
        container["volumeMounts"] = [
            {"name": "kube-api-access", "readOnly": True, "mountPath": mount}
        ]
    pod["status"] = {
        "phase": "Running", "hostIP": "10.0.0.1", "podIP": f"10.1.{index // 250}.{index % 250}",
        "podIPs": [{"ip": f"10.1.{index // 250}.{index % 250}"}], "startTime": stamp,
        "qosClass": "BestEffort",
        "conditions": [{"type": kind, "status": "True", "lastTransitionTime": stamp}
                       for kind in ("Initialized", "Ready", "ContainersReady", "PodScheduled")],
        "containerStatuses": [{"name": "worker", "ready": True, "restartCount": 0, "started": True,
                               "image": WORKER["image"], "imageID": "sha256:abc",
                               "containerID": f"containerd://{index:064x}",
                               "state": {"running": {"startedAt": stamp}}}],
    }  # fmt: skip
    return pod


def pod_list(count: int) -> str:
    return json.dumps(
        {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "99"},
         "items": [served_pod(i) for i in range(count)]}
    )  # fmt: skip


def cpu_ms(call: Callable[[], object], repeat: int) -> float:
    """The median CPU milliseconds of ``call``."""
    times = []
    for _ in range(repeat):
        started = time.process_time()
        call()
        times.append(time.process_time() - started)
    return 1000 * statistics.median(times)


async def timer_lateness(work: Callable[[], object], repeat: int) -> list[float]:
    """How late (ms) a 1 ms timer on the loop fires while ``work`` runs in a thread."""
    late: list[float] = []
    for _ in range(repeat):
        done = asyncio.ensure_future(asyncio.to_thread(work))
        while not done.done():
            due = time.perf_counter() + 0.001
            await asyncio.sleep(0.001)
            late.append(1000 * (time.perf_counter() - due))
        await done
    return late


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    body = pod_list(args.pods)
    client = ApiClient()
    decoded = client.deserialize(body, "V1PodList", "application/json")

    def to_models() -> object:
        return client.deserialize(body, "V1PodList", "application/json")

    def to_dicts() -> object:
        return [client.sanitize_for_serialization(pod) for pod in decoded.items]

    def raw() -> object:
        return json.loads(body)

    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs, nice {os.nice(0)}")
    size = len(body) / 1024
    print(f"{args.pods} pods, {size:.0f} KiB of JSON ({size / args.pods:.1f} KiB a pod)")
    loads, models, dicts = (cpu_ms(f, args.repeat) for f in (raw, to_models, to_dicts))
    print(f"CPU, median of {args.repeat}:")
    print(f"  json.loads of the body          {loads:8.1f} ms")
    print(f"  decoding into V1PodList models  {models:8.1f} ms  (x{models / loads:.0f} raw JSON)")
    print(f"  models back into dicts          {dicts:8.1f} ms  (on the event loop until now)")
    both = models + dicts
    print(f"  what list_pods costs            {both:8.1f} ms  (x{both / loads:.0f})")
    for name, work in (("models, in a thread", to_models), ("raw JSON, in a thread", raw)):
        late = sorted(asyncio.run(timer_lateness(work, args.repeat)))
        print(f"1 ms timer on the loop while decoding {name}: p50 {late[len(late) // 2]:.1f} ms, "
              f"p99 {late[int(0.99 * (len(late) - 1))]:.1f} ms, max {late[-1]:.1f} ms")  # fmt: skip
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
