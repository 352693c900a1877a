"""PersistentVolumeClaims: the volume provisioner's decisions (a row each), and a real claim
bound, written by one pod, read by the next, and its volume deleted with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from devcluster.agent.volumes import claim_dir
from devcluster.provisioner import PROVISIONED_LABEL, released, volume_for
from tests.support.kube import Kube, pod_manifest

pytestmark = pytest.mark.devcluster

RUN = Path("/run/dc")


def claim(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "metadata": {"namespace": "ns", "name": "data", "uid": "u-1"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "2Gi"}}},
        "status": {"phase": "Pending"},
    }
    for key, value in changes.items():
        base[key] = {**base[key], **value}
    return base


@pytest.mark.parametrize(
    ("pvc", "wanted"),
    [
        pytest.param(claim(), True, id="pending"),
        pytest.param(claim(status={"phase": "Bound"}), False, id="bound"),
        pytest.param(claim(spec={"volumeName": "pv-x"}), False, id="names-a-volume"),
        pytest.param(claim(metadata={"deletionTimestamp": "now"}), False, id="being-deleted"),
    ],
)
def test_a_volume_is_made_for_pending_claims_only(pvc: dict[str, Any], wanted: bool) -> None:
    assert (volume_for(pvc, RUN) is not None) is wanted


def test_the_volume_is_pre_bound_to_its_claim_and_points_at_the_claims_folder() -> None:
    volume = volume_for(claim(spec={"storageClassName": "fast"}), RUN)
    assert volume is not None
    spec = volume["spec"]
    assert volume["metadata"]["name"] == "pvc-u-1"
    assert spec["claimRef"] == {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "namespace": "ns",
        "name": "data",
        "uid": "u-1",
    }
    assert spec["hostPath"]["path"] == str(claim_dir(RUN, "ns", "data"))
    assert (spec["capacity"], spec["accessModes"]) == ({"storage": "2Gi"}, ["ReadWriteMany"])
    assert spec["storageClassName"] == "fast"
    bare = volume_for(claim(spec={"resources": {}, "accessModes": []}), RUN)
    assert bare is not None
    assert (bare["spec"]["capacity"], bare["spec"]["accessModes"]) == (
        {"storage": "1Gi"},
        ["ReadWriteOnce"],
    )
    assert bare["spec"]["storageClassName"] == ""


@pytest.mark.parametrize(
    ("labels", "phase", "expected"),
    [
        ({PROVISIONED_LABEL: "true"}, "Released", True),
        ({PROVISIONED_LABEL: "true"}, "Bound", False),
        ({}, "Released", False),
    ],
)
def test_only_our_released_volumes_are_deleted(
    labels: dict[str, str], phase: str, expected: bool
) -> None:
    assert released({"metadata": {"labels": labels}, "status": {"phase": phase}}) is expected


def test_a_claim_is_bound_and_outlives_the_pods_that_mount_it(kube: Kube) -> None:
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    mount = {"volumeMounts": [{"name": "data", "mountPath": "/data"}]}
    volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
    kube.apply(
        pvc,
        pod_manifest("writer", "open('/data/x', 'w').write('kept')", volumes=volumes, **mount),
    )
    bound = kube.wait(
        "the claim bound",
        lambda: (kube.get("pvc", "data") or {}).get("status", {}).get("phase") == "Bound",
        timeout=60,
    )
    assert bound
    assert kube.wait_phase("writer", "Succeeded", "Failed", timeout=60)["status"]["phase"] == (
        "Succeeded"
    )
    kube.apply(
        pod_manifest(
            "reader",
            "import sys; sys.exit(0 if open('/data/x').read() == 'kept' else 3)",
            volumes=volumes,
            **mount,
        )
    )
    assert kube.wait_phase("reader", "Succeeded", "Failed", timeout=60)["status"]["phase"] == (
        "Succeeded"
    )
    volume = (kube.get("pvc", "data") or {})["spec"]["volumeName"]
    kube.kubectl("delete", "pod", "writer", "reader", "--wait=false")
    kube.kubectl("delete", "pvc", "data", "--wait=false")
    kube.wait_gone("pv", volume, timeout=60)
