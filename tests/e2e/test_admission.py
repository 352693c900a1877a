"""Admission on devcluster: `kubectl scale` beyond the job's bounds and a misspelt pod template
field are refused with the field named (by the webhook; without it, the operator marks the
job Failed), and the operator's liveness endpoint answers."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import yaml

from devcluster.cluster import Cluster
from tests.support.elastic_jobs import sleeper, wait_status
from tests.support.kube import Kube
from tests.support.operator_release import (
    both_replicas_ready,
    ready_operator_pods,
)

TYPO = "spec.template.spec.containers[0].resource"


def apply(kube: Kube, manifest: dict[str, Any]) -> tuple[int, str]:
    result = kube.cluster.kubectl(
        "-n", kube.ns, "apply", "-f", "-", input=yaml.safe_dump(manifest), check=False
    )
    return result.returncode, result.stderr


def test_scaling_beyond_the_bounds_is_refused(operator: Cluster, kube: Kube) -> None:
    kube.apply(sleeper("bounded"))
    for replicas, bound in (("4", "maxReplicas (3)"), ("1", "minReplicas (2)")):
        result = kube.cluster.kubectl(
            "-n", kube.ns, "scale", "ej/bounded", f"--replicas={replicas}", check=False
        )
        assert result.returncode != 0, f"scaling to {replicas} was accepted"
        assert "spec.replicas" in result.stderr and bound in result.stderr, result.stderr
    assert (kube.get("ej", "bounded") or {})["spec"]["replicas"] == 2
    kube.kubectl("scale", "ej/bounded", "--replicas=3")
    assert (kube.get("ej", "bounded") or {})["spec"]["replicas"] == 3


def test_a_misspelt_pod_template_field_is_refused(operator: Cluster, kube: Kube) -> None:
    returncode, stderr = apply(kube, sleeper("typo", container={"resource": {"limits": {}}}))
    assert returncode != 0, "the API server accepted a misspelt pod template field"
    assert TYPO in stderr and "'resource'" in stderr, stderr
    assert kube.get("ej", "typo") is None
    returncode, stderr = apply(kube, sleeper("typo", container={"resources": {"limits": {}}}))
    assert returncode == 0, stderr


def test_the_liveness_endpoint_answers_without_telling_about_jobs(
    operator: Cluster, kube: Kube
) -> None:
    both_replicas_ready(kube)
    for pod in ready_operator_pods(operator):  # the leader and the standby
        ip = pod["status"]["podIP"]
        with urllib.request.urlopen(f"http://{ip}:8472/healthz", timeout=10) as response:
            assert response.status == 200
            assert json.loads(response.read()) == {"rendezvous": "serving"}
        try:
            urllib.request.urlopen(f"http://{ip}:8471/healthz", timeout=10)
            raise AssertionError("the metrics port still serves /healthz")
        except urllib.error.HTTPError as exc:
            assert exc.code == 404


def test_without_the_webhook_a_misspelt_field_fails_the_job(
    no_webhook: Cluster, kube: Kube
) -> None:
    returncode, stderr = apply(kube, sleeper("lax", container={"resource": {"limits": {}}}))
    assert returncode == 0, stderr
    failed = wait_status(kube, "lax", "refused", lambda s: s.get("phase") == "Failed")
    invalid = [c for c in failed["conditions"] if c["type"] == "InvalidSpec"]
    assert invalid and TYPO in invalid[0]["message"], failed
    events = json.loads(kube.kubectl("get", "events", "-o", "json"))["items"]
    assert any(e["reason"] == "InvalidSpec" and TYPO in e["message"] for e in events), events
    assert not kube.pods("elasticjob.dev/job-name=lax")
