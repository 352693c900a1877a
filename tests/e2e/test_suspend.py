"""Suspend and resume on devcluster (``spec.suspend``, the contract of queueing systems): a
training job with a checkpoint policy suspends without losing a step and resumes from the
checkpoint its suspension wrote; a trained job without one is suspended only once the user
confirms that it starts afresh; a job created suspended creates no pod until it is resumed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from devcluster.cluster import Cluster
from tests.support.elastic_jobs import (
    checkpointed_job,
    finish_trained_exactly_once,
    job_manifest,
    sleeper,
    stop_workers,
    training_with_a_checkpoint,
    wait_status,
)
from tests.support.kube import Kube

WORKERS = "elasticjob.dev/job-name"


def patch(kube: Kube, name: str, spec: dict[str, Any], *, check: bool = True) -> tuple[int, str]:
    result = kube.cluster.kubectl(
        *("-n", kube.ns, "patch", "ej", name, "--type=merge"),
        *("-p", json.dumps({"spec": spec})),
        check=check,
    )
    return result.returncode, result.stderr


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    (found,) = [c for c in status.get("conditions", []) if c["type"] == kind]
    return found


def suspended(kube: Kube, name: str) -> dict[str, Any]:
    """Wait until the job is Suspended and its pods are gone."""
    found = wait_status(kube, name, "suspended", lambda s: s.get("phase") == "Suspended", 180)
    kube.wait("no worker pod left", lambda: not kube.pods(f"{WORKERS}={name}"), timeout=120)
    assert condition(found, "Suspended")["status"] == "True", found
    assert not found.get("workers") and found.get("replicas", 0) == 0, found
    return found


def reasons(kube: Kube, name: str) -> list[str]:
    """The reasons of the job's events (one per kind of event and message)."""
    events = json.loads(kube.kubectl("get", "events", "-o", "json"))["items"]
    return [e["reason"] for e in events if e["involvedObject"]["name"] == name]


@pytest.mark.timeout(900)
def test_a_suspended_job_resumes_from_the_checkpoint_of_its_last_commit(
    operator: Cluster, kube: Kube, tmp_path: Path
) -> None:
    log_dir, stop_file = tmp_path / "events", tmp_path / "stop"
    checkpointed_job(kube, "paused", log_dir, stop_file)
    try:
        training_with_a_checkpoint(kube, "paused")
        patch(kube, "paused", {"suspend": True})
        before = suspended(kube, "paused")
        # Clean: the checkpoint the suspension wrote holds the last commit.
        assert before["lastCheckpoint"]["step"] == before["progress"]["committedStep"], before
        assert "stopped for the suspension" in condition(before, "Suspended")["message"], before

        patch(kube, "paused", {"suspend": False})
        resumed = wait_status(
            kube,
            "paused",
            "resumed from the suspension's checkpoint",
            lambda s: (
                (s.get("restored") or {}).get("round", 0) > before["round"]
                and s.get("phase") == "Running"
            ),
            timeout=300,
        )
        assert resumed["restored"]["checkpoint"]["name"] == before["lastCheckpoint"]["name"]
        assert resumed["restored"]["stepsLost"] == 0, resumed
        assert condition(resumed, "Suspended")["status"] == "False", resumed
        assert resumed["goodput"]["suspendedSeconds"] > 0, resumed
        seen = reasons(kube, "paused")
        assert seen.count("Suspended") == seen.count("Resumed") == 1, seen
        finish_trained_exactly_once(kube, "paused", log_dir, stop_file)
    finally:
        stop_workers(kube, log_dir)


@pytest.mark.timeout(600)
def test_suspending_a_trained_job_without_checkpoints_needs_confirmation(
    operator: Cluster, kube: Kube, tmp_path: Path
) -> None:
    log_dir, stop_file = tmp_path / "events", tmp_path / "stop"
    kube.apply(job_manifest("unsaved", log_dir, stop_file, replicas=2, minReplicas=2))
    try:
        wait_status(kube, "unsaved", "training", lambda s: s.get("phase") == "Running", 240)
        returncode, stderr = patch(kube, "unsaved", {"suspend": True}, check=False)
        assert returncode != 0, "a suspension that loses the training was accepted"
        assert "spec.suspend" in stderr and "allowSuspendWithoutCheckpoint" in stderr, stderr
        assert (kube.get("ej", "unsaved") or {})["spec"].get("suspend") is not True

        patch(kube, "unsaved", {"suspend": True, "allowSuspendWithoutCheckpoint": True})
        suspended(kube, "unsaved")
        patch(kube, "unsaved", {"suspend": False})
        wait_status(kube, "unsaved", "training again", lambda s: s.get("phase") == "Running", 240)
        events = json.loads(kube.kubectl("get", "events", "-o", "json"))["items"]
        resumed = [e["message"] for e in events if e["reason"] == "Resumed"]
        assert resumed and "training starts afresh" in resumed[0], resumed
    finally:
        stop_workers(kube, log_dir)


def test_a_job_created_suspended_creates_no_pod_until_it_is_resumed(
    operator: Cluster, kube: Kube
) -> None:
    kube.apply(sleeper("queued", suspend=True))
    status = wait_status(kube, "queued", "suspended", lambda s: s.get("phase") == "Suspended")
    assert condition(status, "Suspended")["status"] == "True", status
    assert not kube.pods(f"{WORKERS}=queued"), "a suspended job created pods"
    assert "Created" not in reasons(kube, "queued")
    patch(kube, "queued", {"suspend": False})
    kube.wait("its pods created", lambda: len(kube.pods(f"{WORKERS}=queued")) == 2, timeout=120)
