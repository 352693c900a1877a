"""The durable fallback on devcluster with a real PersistentVolumeClaim (bound by devcluster's
volume provisioner): every worker pod deleted at once, then an operator restart that finds no
worker pod left (one job, both in turn), each resume from the newest checkpoint on the claim
instead of failing or starting over; the status names the checkpoint loaded, every sample
is trained exactly once relative to it, and the job succeeds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from devcluster.agent.volumes import claim_dir
from devcluster.cluster import Cluster
from tests.support.elastic_jobs import (
    checkpointed_job,
    finish_trained_exactly_once,
    stop_workers,
    training_with_a_checkpoint,
    wait_status,
)
from tests.support.kube import Kube
from tests.support.operator_release import (
    RELEASE,
    SYSTEM_NS,
    operator_pods,
    running_operator_pods,
    wait_operator_serving,
)

WORKERS = "elasticjob.dev/job-name"


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


@pytest.mark.timeout(900)
def test_every_worker_pod_deleted_then_an_operator_restart_finding_none_resume_from_checkpoints(
    operator: Cluster, kube: Kube, tmp_path: Path
) -> None:
    """One job loses every worker twice: its pods deleted at once; then, once it trains from
    that checkpoint and has written a newer one, the operator goes away, the pods are
    force-deleted, and the operator comes back to find none. Both times it resumes from the
    newest checkpoint; in the end every sample was trained once relative to them."""
    name, log_dir, stop_file = "fallback", tmp_path / "events", tmp_path / "stop"
    checkpointed_job(kube, name, log_dir, stop_file)
    deployment = ("-n", SYSTEM_NS, "scale", "deployment", RELEASE)
    found = operator.kubectl(
        "-n", SYSTEM_NS, "get", "deployment", RELEASE, "-o", "jsonpath={.spec.replicas}"
    )
    replicas = found.stdout.strip()  # put back as found: the session's other tests share it
    try:
        before = training_with_a_checkpoint(kube, name)
        kube.kubectl("delete", "pod", "-l", f"{WORKERS}={name}", "--wait=false")
        restored = resumed_from_a_checkpoint(kube, name, before)
        loaded = restored["restored"]["checkpoint"]["step"]
        before = wait_status(
            kube,
            name,
            "a checkpoint newer than the one loaded",
            lambda s: (
                s.get("phase") == "Running"
                and (s.get("lastCheckpoint") or {}).get("step", 0) > loaded
            ),
            timeout=240,
        )
        old = {p["metadata"]["name"] for p in operator_pods(operator)}
        operator.kubectl(*deployment, "--replicas=0")
        kube.wait("no operator running", lambda: not running_operator_pods(operator), timeout=180)
        kube.kubectl("delete", "pod", "-l", f"{WORKERS}={name}", "--grace-period=0", "--force")
        kube.wait("no worker pod left", lambda: not kube.pods(f"{WORKERS}={name}"), timeout=120)
        operator.kubectl(*deployment, "--replicas=1")
        wait_operator_serving(kube, old)
        resumed_from_a_checkpoint(kube, name, before)
        finish_trained_exactly_once(kube, name, log_dir, stop_file)
    finally:
        operator.kubectl(*deployment, f"--replicas={replicas}", check=False)
        stop_workers(kube, log_dir)
