"""The durable fallback on devcluster with a real PersistentVolumeClaim (bound by devcluster's
volume provisioner): every worker pod deleted at once, and an operator restart that finds no
worker pod left, each resume from the newest checkpoint on the claim instead of failing or
starting over; the status names the checkpoint loaded, every sample is trained exactly once
relative to it, and the job succeeds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from devcluster.agent.volumes import claim_dir
from devcluster.cluster import Cluster
from tests.support.elastic_jobs import job_manifest, stop_workers, wait_status
from tests.support.job_runs import read_events
from tests.support.kube import Kube
from tests.support.operator_release import RELEASE, SYSTEM_NS, operator_pods, wait_operator_serving

WORKERS = "elasticjob.dev/job-name"


def checkpointed_job(kube: Kube, name: str, log_dir: Path, stop_file: Path) -> None:
    """A claim, and a job of 2 pods that checkpoints to it every 2 commits."""
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": f"{name}-checkpoints"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    job = job_manifest(name, log_dir, stop_file, replicas=2, minReplicas=2)
    pod_spec = job["spec"]["template"]["spec"]
    pod_spec["volumes"].append(
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": f"{name}-checkpoints"}}
    )
    job["spec"]["checkpoint"] = {
        "volume": "checkpoints",
        "path": "/checkpoints",
        "everyCommits": 2,
        "keep": 2,
    }
    kube.apply(claim, job)


def training_with_a_checkpoint(kube: Kube, name: str) -> dict[str, Any]:
    return wait_status(
        kube,
        name,
        "training with a checkpoint written",
        lambda s: s.get("phase") == "Running" and s.get("lastCheckpoint") and s.get("progress"),
        timeout=240,
    )


def resumed_from_a_checkpoint(kube: Kube, name: str, before: dict[str, Any]) -> dict[str, Any]:
    """Wait for the fallback: a restore in a later round than ``before``'s, training on."""
    old_pods = {w["pod"] for w in before["workers"]}
    restored = wait_status(
        kube,
        name,
        "resumed from a checkpoint in fresh pods",
        lambda s: (
            (s.get("restored") or {}).get("round", 0) > before["round"]
            and s.get("phase") == "Running"
            and not old_pods & {w["pod"] for w in s.get("workers", [])}
        ),
        timeout=300,
    )
    # The newest: not older than the one the status showed before the loss (workers train on
    # and checkpoint while no operator runs, so it may be newer than any the status showed).
    loaded = restored["restored"]["checkpoint"]
    assert loaded["step"] >= before["lastCheckpoint"]["step"], (before, restored)
    assert restored["restored"]["time"], restored
    folder = claim_dir(kube.cluster.config.run_dir, kube.ns, f"{name}-checkpoints")
    if kube.cluster.config.runtime == "process":
        assert folder.is_dir()
    return restored


def finish_trained_exactly_once(kube: Kube, name: str, log_dir: Path, stop_file: Path) -> None:
    stop_file.touch()
    done = wait_status(kube, name, "success", lambda s: s.get("phase") == "Succeeded", 240)
    assert done["restored"], done
    finals = [e for e in read_events(log_dir) if e["ev"] == "done"]
    assert finals, "no worker reported its final state"
    assert len({e["digest"] for e in finals}) == 1, f"ranks disagree: {finals}"
    (epochs,) = {e["epochs"] for e in finals}
    for e in finals:  # relative to the checkpoint: nothing skipped, nothing twice
        assert e["seen_min"] == e["seen_max"] == epochs, e
    reasons = {
        ev["reason"] for ev in json.loads(kube.kubectl("get", "events", "-o", "json"))["items"]
    }
    assert "RestoredFromCheckpoint" in reasons, reasons


@pytest.mark.timeout(900)
def test_every_worker_pod_deleted_resumes_from_the_checkpoint(
    operator: Cluster, kube: Kube, tmp_path: Path
) -> None:
    log_dir, stop_file = tmp_path / "events", tmp_path / "stop"
    checkpointed_job(kube, "evicted", log_dir, stop_file)
    try:
        before = training_with_a_checkpoint(kube, "evicted")
        kube.kubectl("delete", "pod", "-l", f"{WORKERS}=evicted", "--wait=false")
        resumed_from_a_checkpoint(kube, "evicted", before)
        finish_trained_exactly_once(kube, "evicted", log_dir, stop_file)
    finally:
        stop_workers(kube, log_dir)


@pytest.mark.timeout(900)
def test_an_operator_restart_that_finds_no_worker_pod_resumes_from_the_checkpoint(
    operator: Cluster, kube: Kube, tmp_path: Path
) -> None:
    log_dir, stop_file = tmp_path / "events", tmp_path / "stop"
    checkpointed_job(kube, "orphaned", log_dir, stop_file)
    deployment = ("-n", SYSTEM_NS, "scale", "deployment", RELEASE)
    try:
        before = training_with_a_checkpoint(kube, "orphaned")
        old = {p["metadata"]["name"] for p in operator_pods(operator)}
        operator.kubectl(*deployment, "--replicas=0")
        kube.wait("the operator gone", lambda: not operator_pods(operator), timeout=180)
        kube.kubectl("delete", "pod", "-l", f"{WORKERS}=orphaned", "--grace-period=0", "--force")
        kube.wait("no worker pod left", lambda: not kube.pods(f"{WORKERS}=orphaned"), timeout=120)
        operator.kubectl(*deployment, "--replicas=1")
        wait_operator_serving(kube, old)
        resumed_from_a_checkpoint(kube, "orphaned", before)
        finish_trained_exactly_once(kube, "orphaned", log_dir, stop_file)
    finally:
        operator.kubectl(*deployment, "--replicas=1", check=False)
        stop_workers(kube, log_dir)
