"""The operator's own lifecycle on devcluster: a worker that dies while the operator restarts
is recovered from (the survivors wait for the new operator instead of giving up), an operator
whose node stops answering hands the job over to its successor, and after `helm uninstall`
nothing the operator left blocks deleting the jobs or the CRD."""

from __future__ import annotations

from pathlib import Path

import yaml

from devcluster.cluster import Cluster
from tests.support.elastic_jobs import (
    STARTUP_S,
    job_manifest,
    sleeper,
    stop_workers,
    wait_status,
    worker_logs,
)
from tests.support.job_runs import read_events
from tests.support.kube import Kube, node_ready_untainted, pod_log_files
from tests.support.operator_release import (
    OPERATOR_PODS,
    RELEASE,
    SYSTEM_NS,
    operator_pods,
    serving_operator_pods,
    wait_operator_serving,
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


def old_operator_log(cluster: Cluster, pod: str) -> str:
    """The log of an operator pod on a node whose kubelet is down, from the files its
    container runtime writes (the API cannot reach that kubelet)."""
    _, logs = pod_log_files(cluster, SYSTEM_NS, pod)
    return "".join(path.read_text(errors="replace") for path in logs)


def test_an_operator_whose_node_stops_answering_hands_the_job_over(
    operator: Cluster, kube: Kube, tmp_path: Path
) -> None:
    """The operator's node goes NotReady (its kubelet stops; its containers run on): its pod
    is marked not ready, the Service no longer routes to it, and it takes none of its workers
    for silent. Its pod is evicted and the Deployment starts a successor, but no kubelet stops
    the old process: it stops itself once its pod is being deleted, and the successor takes
    the job over without a reset. Training never waits for the operator meanwhile."""
    (old,) = [p for p in operator_pods(operator) if not p["metadata"].get("deletionTimestamp")]
    node = old["spec"]["nodeName"]
    log_dir, stop_file = tmp_path / "events", tmp_path / "stop"
    manifest = job_manifest("handover", log_dir, stop_file, replicas=2, minReplicas=2)
    manifest["spec"]["template"]["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [node]}
                        ]
                    }
                ]
            }
        }
    }
    kube.apply(manifest)
    try:
        running = wait_status(
            kube,
            "handover",
            "training with 2 workers",
            lambda s: s.get("phase") == "Running" and s.get("worldSize") == 2,
            STARTUP_S,
        )
        operator.faults.node_notready(node)
        at_cut = max(
            (e["epoch"] for e in read_events(log_dir) if e["ev"] == "epoch_end"), default=-1
        )
        kube.wait(
            "the operator's pod marked not ready with its node",
            lambda: not serving_operator_pods(operator),
            timeout=60,
        )
        # The node controller evicts the pod once its toleration runs out: it is marked for
        # deletion, which its kubelet never confirms, and its process runs on.
        wait_operator_serving(kube, {old["metadata"]["name"]})
        epoch = max(
            (e["epoch"] for e in read_events(log_dir) if e["ev"] == "epoch_end"), default=-1
        )
        assert epoch > at_cut, "training waited for the unreachable operator"
        trained_on = wait_status(
            kube,
            "handover",
            "training on under the successor",
            lambda s: (s.get("progress") or {}).get("epoch", -1) > epoch + 1,
            timeout=120,
        )
        assert trained_on["phase"] == "Running", trained_on
        assert trained_on["round"] == running["round"], "the successor adopted the round"
        assert trained_on["resetCount"] == running["resetCount"], trained_on
        (successor,) = serving_operator_pods(operator)
        successor_log = operator.kubectl("-n", SYSTEM_NS, "logs", successor).stdout
        assert "resumed round" in successor_log
        assert "sent no heartbeat" not in successor_log
        kube.wait(
            "the old operator stopping itself",
            lambda: (
                "stopping: its pod is being deleted"
                in old_operator_log(operator, old["metadata"]["name"])
            ),
            timeout=60,
        )
        old_log = old_operator_log(operator, old["metadata"]["name"])
        assert "workers cannot reach it" in old_log
        assert "sent no heartbeat" not in old_log
        stop_file.touch()
        wait_status(kube, "handover", "success", lambda s: s.get("phase") == "Succeeded", 180)
    finally:
        stop_workers(kube, log_dir)
        operator.faults.node_ready(node)
        kube.wait("the node Ready again", lambda: node_ready_untainted(kube, node), timeout=120)


def test_after_uninstall_jobs_and_the_crd_can_be_deleted(operator: Cluster, kube: Kube) -> None:
    """Runs last in this module: it uninstalls the operator and deletes the CRD (the next
    install brings it back from the chart)."""
    kube.apply(sleeper("orphan"))
    kube.wait("the job's pods", lambda: kube.pods("elasticjob.dev/job-name=orphan"), timeout=120)
    job = kube.get("ej", "orphan") or {}
    assert not job["metadata"].get("finalizers"), job["metadata"]
    configuration = f"{RELEASE}.{SYSTEM_NS}.svc"
    found = operator.kubectl("get", "validatingwebhookconfiguration", configuration, check=False)
    assert found.returncode == 0, found.stderr
    result = operator.helm(
        "uninstall", RELEASE, "-n", SYSTEM_NS, "--wait", check=False, timeout=180
    )
    assert result.returncode == 0, result.stderr

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
