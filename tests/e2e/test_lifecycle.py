"""The lifecycle of the operator and its jobs on devcluster: a worker that dies while every
operator replica restarts is recovered from (the survivors wait for the new operator instead of
giving up), a broken script ends its job instead of forming round after round, a job past its
active deadline fails and is deleted after its ttl, and after `helm
uninstall` nothing the operator left blocks deleting the jobs or the CRD. A leader that fails
while a standby runs: ``test_high_availability.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from devcluster.cluster import Cluster
from tests.support.elastic_jobs import (
    STARTUP_S,
    condition,
    job_manifest,
    sleeper,
    status,
    stop_workers,
    wait_status,
    worker_logs,
)
from tests.support.job_runs import WORKERS, read_events
from tests.support.kube import Kube
from tests.support.operator_release import (
    OPERATOR_PODS,
    RELEASE,
    SYSTEM_NS,
    OperatorRelease,
    operator_pods,
    wait_operator_serving,
)

JOB_PODS = "elasticjob.dev/job-name=deadline"
"""The pods of the job the deadline test runs."""


def test_a_script_that_raises_on_rank_0_in_every_round_fails_the_job_with_its_exception(
    operator: Cluster, kube: Kube, tmp_path: Path
) -> None:
    """Rank 0 raises before its first commit, whichever pod holds it: the other workers roll
    back and the job forms a new round without the failed pod, twice, then fails (its
    ``maxFailedRoundsWithoutCommit``), its status saying why with the exception."""
    log_dir = tmp_path / "events"
    command = ["python", str(WORKERS / "broken_worker.py"), "--log-dir", str(log_dir)]
    command += ["--raise-on", "rank-0", "--at-step", "0"]
    job = job_manifest("broken", log_dir, tmp_path / "stop", command, replicas=2, minReplicas=2)
    job["spec"]["maxFailedRoundsWithoutCommit"] = 2
    job["spec"]["blacklist"] = {"scope": "Pod"}  # a new pod may land on the failed one's node
    kube.apply(job)
    try:
        failed = wait_status(
            kube,
            "broken",
            "its end",
            lambda s: s.get("phase") in ("Failed", "Succeeded"),
            STARTUP_S + 120,
        )
        assert failed["phase"] == "Failed", failed
        message = condition(failed, "Failed").get("message", "")
        assert "2 rounds in a row failed with no new commit" in message, failed
        assert "ValueError: broken on purpose at step 0 on rank 0" in message, failed
        starts = [e for e in read_events(log_dir) if e["ev"] == "start"]
        assert {e["round"] for e in starts} == {1, 2}, starts
    finally:
        stop_workers(kube, log_dir)


def test_a_job_past_its_active_deadline_fails_and_is_deleted_after_its_ttl(
    operator: Cluster, kube: Kube
) -> None:
    """``activeDeadlineSeconds`` fails the job (reason DeadlineExceeded) whatever it is doing
    then (here: its pod never registers); ``ttlSecondsAfterFinished`` then deletes it, and its
    pods are deleted with it."""
    job = sleeper("deadline", replicas=1, minReplicas=1, maxReplicas=1)
    job["spec"].update(activeDeadlineSeconds=10, ttlSecondsAfterFinished=2)
    kube.apply(job)
    failed = kube.wait(
        "ElasticJob deadline: Failed",
        lambda: (s := status(kube, "deadline")).get("phase") == "Failed" and s,
        STARTUP_S,
    )
    ended = condition(failed, "Failed")
    assert ended.get("reason") == "DeadlineExceeded", failed
    assert "past its active deadline of 10 s" in ended.get("message", ""), failed
    kube.wait_gone("ej", "deadline", timeout=60)
    kube.wait(
        "the job's pods to be deleted",
        lambda: all(p["metadata"].get("deletionTimestamp") for p in kube.pods(JOB_PODS)),
        60,
    )


def test_a_worker_lost_while_the_operator_restarts_is_recovered_from(
    operator: Cluster, kube: Kube, tmp_path: Path
) -> None:
    log_dir, stop_file = tmp_path / "events", tmp_path / "stop"
    kube.apply(job_manifest("restart", log_dir, stop_file))
    try:
        running = wait_status(
            kube,
            "restart",
            "training with 3 workers",
            lambda s: s.get("phase") == "Running" and s.get("worldSize") == 3,
            STARTUP_S,
        )
        old = {p["metadata"]["name"] for p in operator_pods(operator)}
        victim = next(w for w in running["workers"] if 0 not in w["ranks"])
        survivors = {w["pod"] for w in running["workers"]} - {victim["pod"]}
        operator.kubectl("-n", SYSTEM_NS, "delete", "pod", "-l", OPERATOR_PODS, "--wait=false")
        operator.faults.kill(victim["pod"], kube.ns)  # before the new operator is up
        wait_operator_serving(kube, old)
        recovered = wait_status(
            kube,
            "restart",
            "a new round without the killed worker",
            lambda s: (
                s.get("phase") == "Running"
                and s.get("round", 0) > running["round"]
                and s.get("resetCount", 0) > running["resetCount"]
                and victim["pod"] not in {w["pod"] for w in s.get("workers", [])}
            ),
            timeout=180,
        )
        # The survivors kept their processes: they waited for the new operator (503, retry)
        # rather than failing on a job it did not know yet.
        assert survivors <= {w["pod"] for w in recovered["workers"]}, recovered
        assert "refused with 404" not in worker_logs(kube)
        # The new operator validates again (kopf re-registers its webhooks at start).
        refused = kube.cluster.kubectl(
            "-n",
            kube.ns,
            "apply",
            "-f",
            "-",
            input=yaml.safe_dump(sleeper("bad", replicas=9)),
            check=False,
        )
        assert refused.returncode != 0 and "spec.replicas" in refused.stderr, refused.stderr
        # The new operator may have the job training again before its first epoch ends.
        ended = [e["epoch"] for e in read_events(log_dir) if e["ev"] == "epoch_end"]
        before = max(ended, default=-1)
        wait_status(
            kube,
            "restart",
            "training on under the new operator",
            lambda s: (s.get("progress") or {}).get("epoch", -1) > before,
        )
        stop_file.touch()
        wait_status(kube, "restart", "success", lambda s: s.get("phase") == "Succeeded", 180)
    finally:
        stop_workers(kube, log_dir)


@pytest.mark.uninstalls_operator
def test_after_uninstall_jobs_and_the_crd_can_be_deleted(
    operator: Cluster, operator_release: OperatorRelease, kube: Kube
) -> None:
    """Runs after the other tests that use the operator: it uninstalls the operator and
    deletes the CRD (the next install brings it back from the chart)."""
    kube.apply(sleeper("orphan"))
    kube.wait("the job's pods", lambda: kube.pods("elasticjob.dev/job-name=orphan"), timeout=120)
    job = kube.get("ej", "orphan") or {}
    assert not job["metadata"].get("finalizers"), job["metadata"]
    configuration = f"{RELEASE}.{SYSTEM_NS}.svc"
    found = operator.kubectl("get", "validatingwebhookconfiguration", configuration, check=False)
    assert found.returncode == 0, found.stderr
    exits = kube.pod_exits(SYSTEM_NS, OPERATOR_PODS)
    result = operator.helm(
        "uninstall", RELEASE, "-n", SYSTEM_NS, "--wait", check=False, timeout=180
    )
    assert result.returncode == 0, result.stderr
    operator_release.uninstalled()
    # Its ServiceAccount and RBAC went with the release: the operator still ends cleanly.
    codes = exits.wait_gone(90)
    assert codes and set(codes.values()) == {0}, codes

    def leftovers() -> list[str]:
        kinds = "validatingwebhookconfiguration,mutatingwebhookconfiguration"
        found = operator.kubectl("get", kinds, "-o", "name", check=False).stdout.split()
        return [name for name in found if name.endswith(f"/{configuration}")]

    kube.wait("the webhook configurations garbage-collected", lambda: not leftovers(), 60)
    deleted = kube.cluster.kubectl(
        "-n", kube.ns, "delete", "ej", "--all", "--timeout=60s", check=False, timeout=90
    )
    assert deleted.returncode == 0, deleted.stderr
    assert kube.get("ej", "orphan") is None
    crd = operator.kubectl(
        "delete", "crd", "elasticjobs.elasticjob.dev", "--timeout=60s", check=False, timeout=90
    )
    assert crd.returncode == 0, crd.stderr
