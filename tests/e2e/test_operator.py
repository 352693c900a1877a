"""The operator end to end on devcluster: installed with helm, driven with kubectl.

A job trains over Gloo between worker pods; it is scaled out, loses a worker to SIGKILL, loses
one to `kubectl delete pod`, keeps its blacklisted node and its Ready condition through an
operator restart, and finishes. The workers' event logs (a directory on this
machine, which devcluster's pods share) tell whether every sample was trained exactly once
in the committed trajectory and whether all ranks ended with the same weights.
"""

from __future__ import annotations

import datetime
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from devcluster.cluster import Cluster
from elasticjob.driver.job_record import EventKind, JobRecordData
from elasticjob.operator.api import worker_labels
from elasticjob.worker_contract import ENV_RENDEZVOUS_CA, ENV_TOKEN
from tests.support.elastic_jobs import (
    STARTUP_S,
    condition,
    job_manifest,
    job_secret_value,
    reader_token,
    stop_workers,
    wait_status,
    worker_env,
    worker_logs,
)
from tests.support.job_runs import WORKERS, read_events
from tests.support.kube import Kube
from tests.support.operator_release import (
    leader_pod,
    operator_ip,
    rendezvous_status,
    restart_operator,
)


@pytest.mark.timeout(900)
def test_elastic_job_scales_survives_failures_and_finishes(
    operator: Cluster, kube: Kube, tmp_path: Path
) -> None:
    log_dir, stop_file = tmp_path / "events", tmp_path / "stop"
    kube.apply(job_manifest("train", log_dir, stop_file))
    try:
        run_lifecycle(kube, log_dir, stop_file)
    finally:
        stop_workers(kube, log_dir)


def moment(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def run_lifecycle(kube: Kube, log_dir: Path, stop_file: Path) -> None:
    first = wait_status(
        kube,
        "train",
        "training with 3 workers",
        lambda s: s.get("phase") == "Running" and s.get("worldSize") == 3,
        STARTUP_S,
    )
    assert first["selector"] and first["replicas"] == 3
    assert sorted(r for w in first["workers"] for r in w["ranks"]) == [0, 1, 2]

    # Scale out: two pods join, world size 5, no rollback.
    kube.kubectl("scale", "ej/train", "--replicas=5")
    scaled = wait_status(
        kube,
        "train",
        "world size 5",
        lambda s: s.get("worldSize") == 5 and s.get("phase") == "Running",
    )
    assert scaled["round"] > first["round"]
    assert "rolling back" not in worker_logs(kube), "scale-out must keep live state"

    # SIGKILL a worker: its node is blacklisted, survivors roll back and resume, and a
    # replacement lands on another node.
    victim = next(w for w in scaled["workers"] if 0 not in w["ranks"])
    kube.cluster.faults.kill(victim["pod"], kube.ns)
    recovered = wait_status(
        kube,
        "train",
        "recovery from the SIGKILL with a replacement",
        lambda s: (
            s.get("worldSize", 0) >= 4
            and s.get("resetCount", 0) > scaled["resetCount"]
            and s.get("phase") == "Running"
            and any(b["node"] == victim["node"] for b in s.get("blacklistedNodes", []))
        ),
        timeout=180,
    )
    assert all(w["node"] != victim["node"] for w in recovered["workers"])
    # The survivors re-form either by rolling back (a collective with the dead worker failed)
    # or, when the failure notice reached them between steps before any collective failed, by
    # a host update with live state; which comes first is a matter of timing.
    logs = worker_logs(kube)
    assert "rolling back to the last commit" in logs or "hosts updated" in logs, logs[-6000:]
    rollbacks = worker_logs(kube).count("rolling back")

    # kubectl delete pod: a graceful departure, no rollback.
    leaving = next(w for w in recovered["workers"] if 0 not in w["ranks"])
    kube.kubectl("delete", "pod", leaving["pod"], "--wait=false")
    wait_status(
        kube,
        "train",
        "the deleted pod's departure, and its replacement in the job",
        lambda s: (
            s.get("phase") == "Running"
            and all(w["pod"] != leaving["pod"] for w in s.get("workers", []))
            and s.get("worldSize") == 5
        ),
        timeout=180,
    )
    assert worker_logs(kube).count("rolling back") == rollbacks, (
        "a deleted pod must leave gracefully"
    )

    # Restart the operator mid-training: the workers train on, and the new operator takes the
    # round over (status updates resume, and it drives the next membership change).
    before = read_events(log_dir)
    pods_before = {p["metadata"]["name"] for p in kube.pods("elasticjob.dev/job-name=train")}
    restart_operator(kube)
    progressed = wait_status(
        kube,
        "train",
        "progress reported to the new operator",
        lambda s: (
            (s.get("progress") or {}).get("epoch", -1)
            > max(e["epoch"] for e in before if e["ev"] == "epoch_end")
        ),
    )
    # No worker process restarted: every process started since is the first of a pod that
    # existed before the operator restart (a replacement may still have been starting up).
    started_before = {e["host"] for e in before if e["ev"] == "start"}
    restarts = [
        e["host"]
        for e in read_events(log_dir)
        if e["ev"] == "start"
        and e["time"] > before[-1]["time"]
        and (e["host"] in started_before or e["host"] not in pods_before)
    ]
    assert not restarts, f"workers must not restart with the operator: {restarts}"
    rollbacks = worker_logs(kube).count("rolling back")
    kube.kubectl("scale", "ej/train", "--replicas=4")
    scaled_in = wait_status(
        kube,
        "train",
        "world size 4 under the new operator",
        lambda s: (
            s.get("worldSize") == 4
            and s.get("round", 0) > progressed["round"]
            and s.get("phase") == "Running"
        ),
        timeout=180,
    )

    assert worker_logs(kube).count("rolling back") == rollbacks, "scale-in must keep live state"
    # What the restarted operator carried over: the blacklisted node, until the same moment
    # and with no pod placed on it since, the reset count, and Ready, which did not flap
    # through the departure, the restart and the scale-in.
    (entry,) = [b for b in recovered["blacklistedNodes"] if b["node"] == victim["node"]]
    still = [b for b in scaled_in["blacklistedNodes"] if b["node"] == victim["node"]]
    assert still, f"the restarted operator forgot blacklisted node {victim['node']}: {scaled_in}"
    assert abs(moment(still[0]["until"]) - moment(entry["until"])) <= datetime.timedelta(
        seconds=1
    ), (entry, still)
    placed = {
        p["spec"].get("nodeName")
        for p in kube.pods("elasticjob.dev/job-name=train")
        if p["status"].get("phase") in ("Pending", "Running")
    }
    assert victim["node"] not in placed, f"a pod was placed on blacklisted {victim['node']}"
    assert scaled_in["resetCount"] >= recovered["resetCount"], "the reset count went back"
    ready = condition(scaled_in, "Ready")
    assert ready["status"] == "True", scaled_in
    assert ready["lastTransitionTime"] == condition(recovered, "Ready")["lastTransitionTime"], (
        "Ready must not flap through a departure, an operator restart and a scale-in"
    )

    # Finish: the job succeeds and running pods are cleaned up (cleanPodPolicy Running).
    stop_file.touch()
    done = wait_status(kube, "train", "success", lambda s: s.get("phase") == "Succeeded", 180)
    assert done["completionTime"]
    succeeded = next(c for c in done["conditions"] if c["type"] == "Succeeded")
    assert succeeded["message"].startswith(f"{done['worldSize']} of {done['worldSize']} workers")
    kube.wait(
        "running worker pods cleaned up",
        lambda: (
            not [
                p
                for p in kube.pods("elasticjob.dev/job-name=train")
                if p.get("status", {}).get("phase") in ("Pending", "Running")
            ]
        ),
        timeout=60,
    )
    events = read_events(log_dir)
    finals = [e for e in events if e["ev"] == "done"]
    assert finals, "no worker reported its final state"
    assert len({e["digest"] for e in finals}) == 1, f"ranks disagree: {finals}"
    (epochs,) = {e["epochs"] for e in finals}
    for e in finals:  # every sample trained exactly once per epoch in the committed trajectory
        assert e["seen_min"] == e["seen_max"] == epochs, e
    reasons = kube.kubectl("get", "events", "-o", "json")
    kinds = {ev["reason"] for ev in json.loads(reasons)["items"]}
    assert {
        "Created",
        "RoundFormed",
        "WorkerFailed",
        "NodeBlacklisted",
        "ScalingIn",
        "Succeeded",
    } <= kinds, kinds
    # Goodput in the status, and the job's record in the cluster, carried over the operator
    # restart: what the timeline picture is drawn from.
    goodput = done["goodput"]
    assert 0 < goodput["ratio"] < 1 and goodput["lastRecoverySeconds"] is not None, goodput
    assert goodput["lostSeconds"]["startup"] > 0, goodput
    stored = kube.get("configmap", "train-record")
    assert stored is not None
    record = JobRecordData.model_validate_json(stored["data"]["record.json"])
    recorded = [e.kind for e in record.events]
    assert recorded.count(EventKind.STARTED) == 1, "the restarted operator carried it on"
    assert {EventKind.FAILURE, EventKind.BLACKLISTED, EventKind.RESUMED} <= set(recorded)
    scales = [e.message for e in record.events if e.kind is EventKind.SCALE]
    assert scales == ["replicas 3 -> 5", "replicas 5 -> 4"], scales
    assert recorded[-1] is EventKind.FINISHED
    assert {s.world_size for s in record.samples} >= {3, 5}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"minReplicas": 4, "maxReplicas": 3, "replicas": 3}, "minReplicas"),
        ({"replicas": 9}, "replicas"),
        ({"template": {"spec": {"containers": []}}}, "containers"),
    ],
    ids=["min-above-max", "replicas-out-of-range", "no-container"],
)
def test_bad_specs_are_refused_with_the_field_named(
    operator: Cluster, kube: Kube, tmp_path: Path, change: dict[str, Any], field: str
) -> None:
    manifest = job_manifest("bad", tmp_path, tmp_path / "stop", **change)
    result = kube.cluster.kubectl(
        "-n", kube.ns, "apply", "-f", "-", input=yaml.safe_dump(manifest), check=False
    )
    assert result.returncode != 0, "the API server accepted an invalid ElasticJob"
    assert field in result.stderr, result.stderr
    assert kube.get("ej", "bad") is None


def test_two_jobs_tokens_budget_policy_metrics_and_slots(
    operator: Cluster, kube: Kube, tmp_path: Path
) -> None:
    """Two jobs side by side, each checked for what is its own (independent checks, one pair
    of jobs): a worker token opens only its own job's rendezvous, each pod reading its own
    credential from the job's Secret; the operator's metrics count the job's pods; the job's
    PodDisruptionBudget (owned by it, minAvailable = minReplicas) makes the Eviction API
    refuse to take it below its minimum and follows minReplicas, and its NetworkPolicy
    admits only its worker pods (devcluster's network enforces none: the object is
    checked); ``slotsPerWorker: 2`` runs a process per slot, 4 in 2 pods, which end alike."""
    stop = tmp_path / "stop"
    kube.apply(job_manifest("alpha", tmp_path / "alpha", stop, replicas=2, minReplicas=2))
    kube.apply(
        job_manifest("beta", tmp_path / "beta", stop, replicas=2, minReplicas=2, slotsPerWorker=2)
    )
    try:
        running = wait_status(kube, "alpha", "running", lambda s: s.get("worldSize") == 2)
        slots = wait_status(
            kube,
            "beta",
            "4 processes in 2 pods",
            lambda s: s.get("phase") == "Running" and s.get("worldSize") == 4,
        )
        assert sorted(len(w["ranks"]) for w in slots["workers"]) == [2, 2]
        tokens_open_only_their_own_job(kube)
        metrics_count_the_jobs_pods(kube)
        budget_and_policy_keep_the_job(kube, running["workers"][0]["pod"])
        stop.touch()
        wait_status(kube, "beta", "success", lambda s: s.get("phase") == "Succeeded", 180)
        finals = [e for e in read_events(tmp_path / "beta") if e["ev"] == "done"]
        assert len(finals) == 4 and len({e["digest"] for e in finals}) == 1
    finally:
        stop.touch()
        stop_workers(kube, tmp_path / "alpha")


def tokens_open_only_their_own_job(kube: Kube) -> None:
    token = reader_token(kube, "alpha")
    ca = worker_env(kube, "alpha")[ENV_RENDEZVOUS_CA]
    base = "/v1/jobs"
    assert rendezvous_status(kube, f"{base}/{kube.ns}.alpha/round", token, ca) == 200
    assert rendezvous_status(kube, f"{base}/{kube.ns}.beta/round", token, ca) == 403
    assert rendezvous_status(kube, f"{base}/{kube.ns}.beta/round", "", ca) == 401
    # Each pod reads its own credential, kept under its name in the job's Secret.
    for pod in kube.pods("elasticjob.dev/job-name=alpha"):
        name = pod["metadata"]["name"]
        (ref,) = [e for e in pod["spec"]["containers"][0]["env"] if e["name"] == ENV_TOKEN]
        assert ref["valueFrom"]["secretKeyRef"] == {"name": "alpha-rendezvous", "key": name}
        own = job_secret_value(kube, "alpha", name)
        assert own.startswith(f"{name}."), "it names the pod it speaks for"
        assert rendezvous_status(kube, f"{base}/{kube.ns}.alpha/round", own, ca) == 200
        assert rendezvous_status(kube, f"{base}/{kube.ns}.beta/round", own, ca) == 403


def metrics_count_the_jobs_pods(kube: Kube) -> None:
    with urllib.request.urlopen(f"http://{operator_ip(kube)}:8471/metrics", timeout=10) as response:
        metrics = response.read().decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics)
        for s in family.samples
    }
    job = (("job", f"{kube.ns}.alpha"),)
    assert samples[("elasticjob_jobs", (("phase", "Running"),))] >= 2
    assert samples[("elasticjob_pods_created_total", job)] == 2
    assert samples[("elasticjob_world_size", job)] == 2
    assert samples[("elasticjob_round_formation_seconds_count", job)] >= 1


def budget_and_policy_keep_the_job(kube: Kube, pod: str) -> None:
    """alpha's budget refuses to evict ``pod`` (the job is at its minimum) and follows
    minReplicas; its network policy admits its own workers only."""
    budget = kube.wait("the job's PodDisruptionBudget", lambda: kube.get("pdb", "alpha-workers"))
    assert budget["spec"]["minAvailable"] == 2
    assert budget["metadata"]["ownerReferences"][0]["name"] == "alpha"
    policy = kube.wait("the job's NetworkPolicy", lambda: kube.get("netpol", "alpha-workers"))
    workers = {"matchLabels": worker_labels("alpha")}
    assert policy["spec"]["podSelector"] == workers
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": workers}]}]
    assert policy["metadata"]["ownerReferences"][0]["name"] == "alpha"
    eviction = {
        "apiVersion": "policy/v1beta1",
        "kind": "Eviction",
        "metadata": {"name": pod, "namespace": kube.ns},
    }
    refused = kube.cluster.kubectl(
        "create",
        "--raw",
        f"/api/v1/namespaces/{kube.ns}/pods/{pod}/eviction",
        "-f",
        "-",
        input=json.dumps(eviction),
        check=False,
    )
    assert refused.returncode != 0 and "disruption budget" in refused.stderr, refused
    assert kube.get("pod", pod) is not None
    kube.kubectl("patch", "ej", "alpha", "--type=merge", "-p", '{"spec": {"minReplicas": 1}}')
    kube.wait(
        "the budget following minReplicas",
        lambda: (kube.get("pdb", "alpha-workers") or {}).get("spec", {}).get("minAvailable") == 1,
        timeout=60,
    )


def kill_then_scale_out(
    kube: Kube, name: str, command: list[str], log_dir: Path
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run ``command`` as a restart-mode job of 2 pods (between 2 and 3) whose script kills
    one rank once: once both scripts started again in a world of 2 after the kill (the status
    says so when the round forms, before the scripts log anything), scale it to 3, and await
    its success. Returns its final status and the workers' events."""

    def restarted_after_kill() -> bool:
        events = read_events(log_dir)
        kill = next((e["time"] for e in events if e["ev"] == "kill"), None)
        started = {
            e["rank"]
            for e in events
            if e["ev"] == "start" and e["size"] == 2 and kill is not None and e["time"] > kill
        }
        return started == {0, 1}

    manifest = job_manifest(name, log_dir, log_dir.parent / "stop", command=command)
    manifest["spec"] |= {"mode": "restart", "replicas": 2, "minReplicas": 2, "maxReplicas": 3}
    kube.apply(manifest)
    try:
        kube.wait("both scripts started again after the kill", restarted_after_kill, STARTUP_S)
        kube.kubectl("scale", f"ej/{name}", "--replicas=3")
        done = wait_status(
            kube, name, "success", lambda s: s.get("phase") == "Succeeded", STARTUP_S
        )
    finally:
        stop_workers(kube, log_dir)
    return done, read_events(log_dir)


def assert_every_rank_stayed_in_its_pod(starts: list[dict[str, Any]]) -> None:
    """Each of ranks 0-2 started in one pod only, three pods in all: none was replaced."""
    hosts = {rank: {s["host"] for s in starts if s["rank"] == rank} for rank in (0, 1, 2)}
    assert all(len(h) == 1 for h in hosts.values()), f"a rank moved: {hosts}"
    assert len(set().union(*hosts.values())) == 3, "no pod was replaced"


@pytest.mark.timeout(900)
def test_a_lightning_script_in_restart_mode_survives_a_kill_and_a_scale_out(
    operator: Cluster, kube: Kube, tmp_path: Path
) -> None:
    """An unchanged PyTorch Lightning script (``lightning_worker.py``: ``Trainer(strategy=
    "ddp")`` on torchrun's variables, resuming from its ``last.ckpt``) with ``mode: restart``:
    rank 1 SIGKILLs itself at step 5, then the job is scaled from 2 pods to 3 (the script waits
    for 3 at step 10). Every script starts again with its rank in the pod it ran in (no pod is
    replaced), resumes from its checkpoint, and the job finishes in a world of 3; the kill
    counts as a restart, the scale-out does not. (A plain torchrun DDP script through the same
    kill and scale-out under ``elasticjob-run``: ``tests/integration/test_restart_mode.py``.)"""
    log_dir = tmp_path / "events"
    script = [
        *("python", str(WORKERS / "lightning_worker.py"), "--log-dir", str(log_dir)),
        *("--checkpoint", str(tmp_path / "checkpoints"), "--epochs", "4", "--step-s", "0.05"),
        *("--fail-at", "5:1", "--await-size", "10:3"),
    ]
    done, events = kill_then_scale_out(kube, "lightning", script, log_dir)
    assert [(e["rank"], e["step"]) for e in events if e["ev"] == "kill"] == [(1, 5)]
    starts = [e for e in events if e["ev"] == "start"]
    assert_every_rank_stayed_in_its_pod(starts)
    after_kill = [s for s in starts if s["size"] == 2 and s["step"] > 0]
    assert {(s["rank"], s["step"]) for s in after_kill[:2]} == {(0, 5), (1, 5)}, (
        "both ranks resumed from the checkpoint of the step before the kill"
    )
    last = {s["rank"]: s for s in starts}  # each rank's last start
    assert {(s["size"], s["env"]["GROUP_WORLD_SIZE"]) for s in last.values()} == {(3, "3")}
    assert {r: s["env"]["TORCHELASTIC_RESTART_COUNT"] for r, s in last.items()} == {
        0: "1",
        1: "1",
        2: "0",  # a new pod starts at 0, as a new torchrun node does
    }, "the kill counts as a restart, the scale-out does not"
    assert done["resetCount"] >= 2, done  # the kill, then the scale-out
    finals = [e for e in events if e["ev"] == "done"]
    assert len(finals) == 3 and len({e["digest"] for e in finals}) == 1, finals
    kill = next(e["time"] for e in events if e["ev"] == "kill")
    again = [min(s["time"] for s in after_kill if s["rank"] == r) for r in (0, 1)]
    print(
        f"restart mode on real nodes: both scripts again {max(again) - kill:.1f} s after the kill"
    )


def test_preemption_and_a_not_ready_node_are_survived(
    operator: Cluster, kube: Kube, tmp_path: Path
) -> None:
    """A preempted pod (DisruptionTarget, then SIGTERM) leaves without a rollback; a node
    that stops heartbeating costs its worker, and the job goes on without it."""
    log_dir = tmp_path / "events"
    kube.apply(job_manifest("spot", log_dir, tmp_path / "stop", replicas=3, minReplicas=2))
    lost: dict[str, Any] | None = None
    try:
        running = wait_status(
            kube,
            "spot",
            "3 workers",
            lambda s: s.get("phase") == "Running" and s.get("worldSize") == 3,
        )
        preempted = next(w for w in running["workers"] if 0 not in w["ranks"])
        operator.faults.evict(preempted["pod"], kube.ns)
        after = wait_status(
            kube,
            "spot",
            "the preempted pod replaced",
            lambda s: (
                s.get("phase") == "Running"
                and s.get("worldSize") == 3
                and s.get("round", 0) > running["round"]
                and preempted["pod"] not in {w["pod"] for w in s.get("workers", [])}
            ),
            timeout=180,
        )
        assert "rolling back" not in worker_logs(kube), "preemption must be graceful"
        # A worker's node, not the leading operator's: a leader on a NotReady node is another
        # scenario (tests/e2e/test_high_availability.py). Rank 0's only when every other
        # worker shares the leader's node (the replacement of the preempted pod may go there).
        leader = kube.wait("the operator's leader", lambda: leader_pod(kube.cluster), timeout=60)
        candidates = sorted(
            (w for w in after["workers"] if w["node"] != leader["spec"].get("nodeName")),
            key=lambda w: 0 in w["ranks"],
        )
        assert candidates, f"every worker is on the leader's node: {after['workers']}"
        lost = candidates[0]
        operator.faults.node_notready(lost["node"])
        wait_status(
            kube,
            "spot",
            "training on without the NotReady node",
            lambda s: (
                s.get("phase") == "Running"
                and s.get("round", 0) > after["round"]
                and all(w["node"] != lost["node"] for w in s.get("workers", []))
            ),
            timeout=180,
        )
        (tmp_path / "stop").touch()
    finally:
        if lost is not None:  # Ready again at once: the operator's standby may run there
            operator.faults.node_ready(lost["node"])
        stop_workers(kube, log_dir)


def test_without_the_webhook_an_invalid_job_is_marked_failed_and_left_alone(
    no_webhook: Cluster, kube: Kube, tmp_path: Path
) -> None:
    kube.apply(job_manifest("lax", tmp_path, tmp_path / "stop", minReplicas=4, maxReplicas=3))
    failed = wait_status(kube, "lax", "refused", lambda s: s.get("phase") == "Failed")
    invalid = [c for c in failed["conditions"] if c["type"] == "InvalidSpec"]
    assert invalid and "minReplicas" in invalid[0]["message"], failed
    assert not kube.pods("elasticjob.dev/job-name=lax")
