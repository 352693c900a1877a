"""Controllers, CRDs and helm against the real control plane."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.support.kube import Kube, pod_manifest

pytestmark = pytest.mark.devcluster

CHARTS = Path(__file__).parent / "charts"


def test_deployment_from_kubectl_gets_a_running_pod(kube: Kube) -> None:
    kube.kubectl("create", "deployment", "web", "--image=busybox", "--", "sleep", "3600")

    def running() -> bool:
        return any(p["status"].get("phase") == "Running" for p in kube.pods("app=web"))

    kube.wait("a Running pod of deployment web", running)
    kube.wait(
        "deployment web to report 1 available replica",
        lambda: (
            (kube.get("deployment", "web") or {}).get("status", {}).get("availableReplicas") == 1
        ),
    )


def test_crd_with_scale_subresource_scales_with_kubectl(kube: Kube) -> None:
    group = f"t{uuid.uuid4().hex[:8]}.devcluster.test"
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                        },
                    },
                }
            ],
        },
    }
    try:
        kube.apply(crd)
        kube.wait(
            "the CRD to be established",
            lambda: any(
                c["type"] == "Established" and c["status"] == "True"
                for c in (kube.get("crd", f"widgets.{group}") or {})
                .get("status", {})
                .get("conditions", [])
            ),
        )
        widget = {
            "apiVersion": f"{group}/v1",
            "kind": "Widget",
            "metadata": {"name": "w"},
            "spec": {"replicas": 1},
        }
        kube.wait("the Widget to be created", lambda: _try_apply(kube, widget))
        kube.kubectl("scale", f"widgets.{group}/w", "--replicas=3")
        scaled = json.loads(kube.kubectl("get", f"widgets.{group}", "w", "-o", "json"))
        assert scaled["spec"]["replicas"] == 3
    finally:
        kube.cluster.kubectl("delete", "crd", f"widgets.{group}", "--wait=false", check=False)


def _try_apply(kube: Kube, obj: dict[str, object]) -> bool:
    try:
        kube.apply(obj)
    except AssertionError:
        return False
    return True


def test_helm_install_of_a_chart_using_the_in_cluster_config(kube: Kube) -> None:
    kube.cluster.helm(
        "install", "lister", str(CHARTS / "pod-lister"), "--namespace", kube.ns, timeout=120
    )
    pod = kube.wait_phase("lister-lister", "Succeeded", "Failed", timeout=60)
    assert pod["status"]["phase"] == "Succeeded", kube.dump()
    assert kube.kubectl("logs", "lister-lister").strip() == "pods: lister-lister"


def test_projected_service_account_token_authenticates(kube: Kube) -> None:
    kube.kubectl(
        "create", "rolebinding", "view", "--clusterrole=view", f"--serviceaccount={kube.ns}:default"
    )
    script = (
        "from kubernetes import client, config\n"
        "config.load_incluster_config()\n"
        "ns = open('/var/run/secrets/kubernetes.io/serviceaccount/namespace').read()\n"
        "pods = client.CoreV1Api().list_namespaced_pod(ns).items\n"
        "print('pods:', [p.metadata.name for p in pods])\n"
    )
    sa_dir = "/var/run/secrets/kubernetes.io/serviceaccount"
    kube.apply(
        pod_manifest(
            "projected",
            script,
            image="elasticjob/worker:dev",
            automountServiceAccountToken=False,
            volumes=[
                {
                    "name": "token",
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}},
                            {
                                "configMap": {
                                    "name": "kube-root-ca.crt",
                                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                }
                            },
                            {
                                "downwardAPI": {
                                    "items": [
                                        {
                                            "path": "namespace",
                                            "fieldRef": {"fieldPath": "metadata.namespace"},
                                        }
                                    ]
                                }
                            },
                        ]
                    },
                }
            ],
            volumeMounts=[{"name": "token", "mountPath": sa_dir, "readOnly": True}],
        )
    )
    pod = kube.wait_phase("projected", "Succeeded", "Failed", timeout=60)
    assert pod["status"]["phase"] == "Succeeded", kube.dump()
    assert kube.kubectl("logs", "projected").strip() == "pods: ['projected']"
