"""Hostile and careless ElasticJobs on devcluster: templates that would take over the worker
contract or the pods' identity are refused at admission, naming the field; planted objects
with a job's labels or names are never taken for the job's own; and without the webhook,
specs the API server accepts but the pods cannot have fail the job once, with a clear
status, no retry storm and no pods left."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from devcluster.cluster import Cluster
from elasticjob.operator.api import worker_labels
from elasticjob.worker_contract import ENV_RENDEZVOUS_URL, ENV_TOKEN
from tests.support.elastic_jobs import (
    condition,
    job_manifest,
    stop_workers,
    wait_ready,
    wait_status,
)
from tests.support.kube import Kube, pod_manifest
from tests.support.operator_release import SYSTEM_NS, operator_logs

REPO = Path(__file__).resolve().parents[2]
LONG_NAME = "a" * 64
STORM_WINDOW_S = 12.0
"""Longer than two of the job supervisor's restart backoffs (5 s): a job whose controller
crash-loops fails again within it."""


def with_worker(manifest: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """``manifest`` with ``fields`` set on its worker container (None: removed)."""
    (worker,) = manifest["spec"]["template"]["spec"]["containers"]
    for key, value in fields.items():
        if value is None:
            worker.pop(key, None)
        else:
            worker[key] = value
    return manifest


def with_template_metadata(manifest: dict[str, Any], **metadata: Any) -> dict[str, Any]:
    manifest["spec"]["template"]["metadata"] = metadata
    return manifest


def apply_refused(kube: Kube, manifest: dict[str, Any]) -> str:
    """Apply ``manifest``, which must be refused; the API server's message."""
    result = kube.cluster.kubectl(
        "-n", kube.ns, "apply", "-f", "-", input=yaml.safe_dump(manifest), check=False
    )
    assert result.returncode != 0, "the API server accepted a hostile ElasticJob"
    assert kube.get("ej", manifest["metadata"]["name"]) is None
    return result.stderr


@pytest.mark.parametrize(
    ("change", "field"),
    [
        pytest.param(
            lambda m: with_worker(
                m,
                env=[
                    {
                        "name": ENV_TOKEN,
                        "valueFrom": {"secretKeyRef": {"name": "other-rendezvous", "key": "key"}},
                    }
                ],
            ),
            "spec.template.spec.containers[0].env[0].name",
            id="another-jobs-token",
        ),
        pytest.param(
            lambda m: with_worker(
                m,
                env=[{"name": "A", "value": "1"}, {"name": ENV_RENDEZVOUS_URL, "value": "x"}],
            ),
            "spec.template.spec.containers[0].env[1].name",
            id="rendezvous-url",
        ),
        pytest.param(
            lambda m: with_worker(
                m, envFrom=[{"prefix": "ELASTICJOB_", "configMapRef": {"name": "c"}}]
            ),
            "spec.template.spec.containers[0].envFrom[0].prefix",
            id="env-from-prefix",
        ),
        pytest.param(
            lambda m: with_template_metadata(m, ownerReferences=[]),
            "spec.template.metadata.ownerReferences",
            id="owner-references",
        ),
        pytest.param(
            lambda m: with_template_metadata(m, finalizers=["x/y"]),
            "spec.template.metadata.finalizers",
            id="finalizers",
        ),
        pytest.param(
            lambda m: with_template_metadata(m, name="fixed"),
            "spec.template.metadata.name",
            id="template-name",
        ),
        pytest.param(
            lambda m: with_worker(m, image=123),
            "spec.template.spec.containers[0].image",
            id="image-not-a-name",
        ),
        pytest.param(
            lambda m: with_worker(m, image=None),
            "spec.template.spec.containers[0].image",
            id="no-image",
        ),
        pytest.param(
            lambda m: {**m, "metadata": {"name": LONG_NAME}}, "metadata.name", id="long-name"
        ),
        pytest.param(
            lambda m: with_template_metadata(m, labels={"elasticjob.dev/job-name": "other"}),
            "spec.template.metadata.labels[elasticjob.dev/job-name]",
            id="operator-label",
        ),
    ],
)
def test_hostile_templates_are_refused_at_admission_naming_the_field(
    operator: Cluster, kube: Kube, tmp_path: Path, change: Any, field: str
) -> None:
    manifest = change(job_manifest("hostile", tmp_path, tmp_path / "stop"))
    message = apply_refused(kube, manifest)
    assert field in message, message


def test_a_job_in_the_operators_own_namespace_is_refused(
    operator: Cluster, kube: Kube, tmp_path: Path
) -> None:
    """There its pods would share the operator's service account and match its Service."""
    manifest = job_manifest("inside", tmp_path, tmp_path / "stop")
    result = operator.kubectl(
        "-n", SYSTEM_NS, "apply", "-f", "-", input=yaml.safe_dump(manifest), check=False
    )
    assert result.returncode != 0 and "metadata.namespace" in result.stderr, result.stderr
    assert "the operator's own namespace" in result.stderr


def test_the_restricted_profile_example_is_admitted(operator: Cluster, kube: Kube) -> None:
    """The example passes the webhook (a server-side dry run goes through admission)."""
    example = REPO / "examples" / "elasticjob-restricted.yaml"
    kube.kubectl("apply", "--dry-run=server", "-f", str(example))


def test_a_planted_pod_with_the_jobs_labels_is_neither_a_worker_nor_deleted(
    operator: Cluster, kube: Kube, tmp_path: Path
) -> None:
    planted = pod_manifest(
        "planted",
        "import time; time.sleep(900)",
        image="elasticjob/worker:0.1.0",  # an image that real nodes have
        labels=worker_labels("owned"),
    )
    kube.apply(planted)
    kube.wait(
        "the planted pod running",
        lambda: ((kube.get("pod", "planted") or {}).get("status") or {}).get("phase") == "Running",
        timeout=60,
    )
    log_dir = tmp_path / "events"
    kube.apply(
        job_manifest("owned", log_dir, tmp_path / "stop", replicas=2, minReplicas=2, maxReplicas=3)
    )
    try:
        wait_ready(kube, "owned")
        running = wait_status(
            kube, "owned", "a round of 2", lambda s: s.get("worldSize") == 2, timeout=60
        )
        assert "planted" not in {w["pod"] for w in running["workers"]}, running
        assert running["replicas"] == 2, running
        pods = {p["metadata"]["name"] for p in kube.pods("elasticjob.dev/job-name=owned")}
        assert len(pods) == 3 and "planted" in pods, pods
        (tmp_path / "stop").touch()
        wait_status(kube, "owned", "success", lambda s: s.get("phase") == "Succeeded", 180)
        left = kube.get("pod", "planted")
        assert left is not None and not left["metadata"].get("deletionTimestamp"), left
    finally:
        stop_workers(kube, log_dir)


def test_a_planted_token_secret_fails_the_job_and_is_never_used(
    operator: Cluster, kube: Kube, tmp_path: Path
) -> None:
    planted = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "mine-rendezvous"},
        "type": "Opaque",
        "stringData": {"key": "known-to-the-planter"},
    }
    kube.apply(planted)
    kube.apply(job_manifest("mine", tmp_path, tmp_path / "stop"))
    failed = wait_status(kube, "mine", "refused", lambda s: s.get("phase") == "Failed", 60)
    message = condition(failed, "InvalidSpec").get("message", "")
    assert f"Secret {kube.ns}/mine-rendezvous" in message, failed
    assert not kube.pods("elasticjob.dev/job-name=mine")
    secret = kube.get("secret", "mine-rendezvous") or {}
    assert base64.b64decode(secret["data"]["key"]) == b"known-to-the-planter"


def test_a_token_secret_left_by_an_earlier_job_of_the_name_is_waited_out(
    operator: Cluster, kube: Kube, tmp_path: Path
) -> None:
    """A Secret an earlier job of the same name controlled is garbage-collected (its owner is
    gone): the new job waits for that, then makes and uses its own."""
    stale = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "again-rendezvous",
            "ownerReferences": [
                {
                    "apiVersion": "elasticjob.dev/v1alpha1",
                    "kind": "ElasticJob",
                    "name": "again",
                    "uid": "00000000-0000-0000-0000-000000000000",
                    "controller": True,
                }
            ],
        },
        "stringData": {"key": "stale"},
    }
    kube.apply(stale)
    log_dir = tmp_path / "events"
    kube.apply(
        job_manifest("again", log_dir, tmp_path / "stop", replicas=2, minReplicas=2, maxReplicas=2)
    )
    try:
        wait_ready(kube, "again")
        job = kube.get("ej", "again") or {}
        secret = kube.get("secret", "again-rendezvous") or {}
        (owner,) = secret["metadata"]["ownerReferences"]
        assert owner["uid"] == job["metadata"]["uid"], secret
        assert base64.b64decode(secret["data"]["key"]) != b"stale"
        (tmp_path / "stop").touch()
        wait_status(kube, "again", "success", lambda s: s.get("phase") == "Succeeded", 180)
    finally:
        stop_workers(kube, log_dir)


CARELESS = {
    LONG_NAME: ({}, "metadata.name: must be at most 63 characters"),
    "template-name": (
        {"metadata": {"name": "fixed"}},
        "spec.template.metadata.name: must not be set",
    ),
    "template-namespace": (
        {"metadata": {"namespace": "elsewhere"}},
        "spec.template.metadata.namespace: must not be set",
    ),
    "image-number": ({"image": 123}, "spec.template.spec.containers[0].image"),
    "no-image": ({"image": None}, "spec.template.spec.containers[0].image"),
    "bad-container-name": (
        {"name": "Bad_Name"},
        "the API server refused the job's objects (422)",
    ),
    "bad-quantity": (
        {"resources": {"requests": {"cpu": "lots"}}},
        "the API server refused the job's objects (400)",
    ),
}
"""Jobs the API server stores without the webhook, by name: a change to the template (a
``metadata`` key: the template's metadata, else fields of the worker container) and what
their InvalidSpec condition says."""


def careless_job(name: str, change: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    manifest = job_manifest(name, tmp_path, tmp_path / "stop")
    if "metadata" in change:
        return with_template_metadata(manifest, **change["metadata"])
    return with_worker(manifest, **change)


def test_without_the_webhook_careless_specs_fail_once_with_no_pods_left(
    no_webhook: Cluster, kube: Kube, tmp_path: Path
) -> None:
    kube.apply(*(careless_job(n, change, tmp_path) for n, (change, _) in CARELESS.items()))
    for name, (_, expected) in CARELESS.items():
        failed = wait_status(kube, name, "failed", lambda s: s.get("phase") == "Failed", 90)
        invalid = condition(failed, "InvalidSpec")
        assert invalid.get("status") == "True", (name, failed)
        assert expected in invalid.get("message", ""), (name, invalid)
    time.sleep(STORM_WINDOW_S)  # an observation window: a retry storm would show in it
    events = json.loads(kube.kubectl("get", "events", "-o", "json"))["items"]
    for name in CARELESS:
        refusals = [
            e
            for e in events
            if e["involvedObject"]["name"] == name and e["reason"] == "InvalidSpec"
        ]
        assert len(refusals) == 1, (name, [e["message"] for e in refusals])
    assert json.loads(kube.kubectl("get", "pods", "-o", "json"))["items"] == []
    logs = operator_logs(kube.cluster)
    assert "elasticjob" in logs, "the operator's log was not found"
    restarts = [
        line for line in logs.splitlines() if f"job {kube.ns}/" in line and "restart" in line
    ]
    assert restarts == [], restarts[:5]
