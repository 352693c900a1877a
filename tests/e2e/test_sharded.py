"""A sharded job end to end on devcluster: the FSDP2 language model example
(``examples/sharded_lm/train.py``, in the worker image built from this checkout) runs as HSDP
(``--hsdp``) in an ElasticJob of two pods of two slots: each pod's two processes shard the
model, the pods replicate it. One training process of a pod is SIGKILLed mid-training (its
pod's other slot goes with it): the other pod keeps its processes (same container, no
restart) and trains on from the last commit, its replica losing nothing and sending nothing;
then the job is scaled to three pods, and each new pod is a replica that receives its shards;
then a pod is deleted (its processes leave gracefully), and the replicas left train on,
sending nothing but its replacement pod's shards. The job succeeds, every sequence trained
exactly once per epoch and the loss falling. What happened is read from the pods' logs (rank
0's lines and the runtime's own).

The one-dimensional reshard (FSDP over every rank) of the same example is tested on four
loopback hosts in ``tests/integration/test_sharded_example.py``."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from devcluster.cluster import Cluster
from tests.support.elastic_jobs import (
    KILL_ONE_SLOT,
    START_SERVER_READY,
    STARTUP_S,
    hsdp_job,
    status,
    stop_workers,
    wait_status,
    worker_logs,
)
from tests.support.kube import Kube

JOB = "sharded-lm"
WORKERS = f"elasticjob.dev/job-name={JOB}"
EPOCHS = 16
TRAIN = [
    *("python", "examples/sharded_lm/train.py", "--hsdp"),
    *("--layers", "2", "--dim", "32", "--heads", "2", "--vocab", "32", "--seq-len", "16"),
    *("--samples", "384", "--batch-size", "8", "--epochs", str(EPOCHS)),
    *("--commit-every", "10", "--log-every", "5", "--pace", "0.1"),
]
"""A tiny model, paced so that the job trains for about a minute after it starts (the loss
still falls to under half of its first value)."""
RESHARDED = re.compile(
    r"round=(\d+) rank=\d+ step=\d+\] resharded commit \d+ from 2 shards onto 2 shards in "
    r"(\d) replica\(s\): (\d+) bytes sent"
)
ROUND_LINE = re.compile(r"round (\d+): (\d+) workers, from epoch (\d+) step (\d+)")
EPOCH_LINE = re.compile(r"epoch (\d+) done: .* exactly once: (True|False)")
STEP_LINE = re.compile(r"epoch \d+ step \d+: loss ([\d.]+)")


def sharded_job(**spec: Any) -> dict[str, Any]:
    """The job, of two pods (up to three) unless ``spec`` says otherwise."""
    return hsdp_job(
        JOB,
        TRAIN,
        grace_s=10,
        **{
            "maxReplicas": 3,
            # Only the killed pod is kept out: with the default (its node), a pod that
            # shared the node would leave too.
            "blacklist": {"scope": "Pod", "cooldownSeconds": {"min": 300, "max": 600}},
            "cleanPodPolicy": "None",  # the pods and their logs stay for the checks
            # A bound on any collective: none should reach it (the state lets go of a
            # broken group, which fails the survivors' collectives at once).
            "collectiveTimeoutSeconds": 20,
            **spec,
        },
    )


def wait_training(kube: Kube, pods: int) -> dict[str, Any]:
    """The job's status once it trains with ``pods`` pods of 2 slots, 10 steps in."""
    return wait_status(
        kube,
        JOB,
        f"training with {pods} pod(s) of 2 slots",
        lambda s: (
            s.get("phase") == "Running"
            and s.get("worldSize") == 2 * pods
            and s.get("progress") is not None
            and (s["progress"]["epoch"], s["progress"]["step"]) >= (0, 10)
        ),
        STARTUP_S,
    )


def succeeded(kube: Kube) -> tuple[dict[str, Any], str]:
    """The job's status once it succeeded, and its workers' logs then."""
    done = wait_status(kube, JOB, "success", lambda s: s.get("phase") == "Succeeded", 300)
    return done, worker_logs(kube)


def worker_failed(kube: Kube) -> list[str]:
    """The messages of the ``WorkerFailed`` events so far."""
    events = json.loads(kube.kubectl("get", "events", "-o", "json"))["items"]
    return [e["message"] for e in events if e["reason"] == "WorkerFailed"]


def containers(kube: Kube) -> dict[str, tuple[str, int]]:
    """Each worker pod's container: its ID and restart count, by pod name."""
    found = {}
    for pod in kube.pods(WORKERS):
        for c in pod.get("status", {}).get("containerStatuses", []):
            found[pod["metadata"]["name"]] = (c.get("containerID", ""), c.get("restartCount", 0))
    return found


def trains_on(
    status: dict[str, Any],
    since: dict[str, Any],
    counter: str,
    keeps: str | None = None,
    lost: str | None = None,
) -> bool:
    """Whether the job's ``status`` is Running, past ``since``'s ``counter`` (its round or
    reset count), with the pod ``keeps`` among its workers and the pod ``lost`` not."""
    pods = {w["pod"] for w in status.get("workers", [])}
    return (
        status.get(counter, 0) > since[counter]
        and status.get("phase") == "Running"
        and (keeps is None or keeps in pods)
        and (lost is None or lost not in pods)
    )


@pytest.mark.timeout(900)
def test_a_pod_of_an_hsdp_job_loses_a_process_and_the_job_scales_out(
    operator: Cluster, kube: Kube, tmp_path: Path
) -> None:
    kube.apply(sharded_job())
    try:
        training = wait_training(kube, pods=2)
        victim = next(w for w in training["workers"] if 0 not in w["ranks"])
        survivor = next(w["pod"] for w in training["workers"] if 0 in w["ranks"])
        before = containers(kube)
        killed = kube.kubectl("exec", victim["pod"], "--", "python", "-c", KILL_ONE_SLOT)
        assert killed.strip(), "no process of the pod's second slot"
        recovered = wait_status(
            kube,
            JOB,
            "the other pod training on after the SIGKILL",
            lambda s: trains_on(s, training, "resetCount", keeps=survivor),
            timeout=180,
        )
        assert containers(kube)[survivor] == (before[survivor][0], 0)  # the same processes
        # The driver heard of it before the pod's status said so: from the pod's slot
        # supervisor, or from the survivors whose collective with it broke, whichever came
        # first (both are early; the kubelet's report would name the container's exit code).
        failed = worker_failed(kube)
        early = ("its pod saw it end with -9", "could not reach it")
        assert failed and all(any(e in m for e in early) for m in failed), failed
        kube.kubectl("scale", f"elasticjob/{JOB}", "--replicas=3")
        scaled = wait_status(
            kube, JOB, "3 pods of 2 slots", lambda s: s.get("worldSize") == 6, timeout=240
        )
        # A pod deleted: its processes leave gracefully, the others train on at once.
        leaving = next(w["pod"] for w in scaled["workers"] if w["pod"] != survivor)
        worker_logs(kube)  # its log, read before the pod goes
        kube.kubectl("delete", "pod", leaving, "--wait=false")
        wait_status(
            kube,
            JOB,
            "training on without the deleted pod",
            lambda s: trains_on(s, scaled, "round", lost=leaving),
            timeout=120,
        )
        done, logs = succeeded(kube)
    finally:
        final = status(kube, JOB)
        stop_workers(kube, tmp_path)
    assert done["completionTime"], final
    assert recovered["round"] > training["round"]
    rounds = [tuple(map(int, m.groups())) for m in ROUND_LINE.finditer(logs)]
    resumed = [r for r in rounds if r[0] > training["round"]]
    assert resumed and (resumed[0][2], resumed[0][3]) > (0, 0), rounds  # from the commit
    # Every rank's reshards (the logs of each pod in turn, not in time order).
    by_round = {int(n): (int(replicas), int(sent)) for n, replicas, sent in RESHARDED.findall(logs)}
    reshards = set(by_round.values())
    # The lost replica: the other sends nothing (unless the replacement pod joined that
    # round already: then it is a new replica and receives one replica's shards).
    assert (1, 0) in reshards or any(replicas == 2 for replicas, _ in reshards), reshards
    assert any(replicas == 3 and sent > 0 for replicas, sent in reshards), reshards
    # The deleted pod's replica: nothing moves, but for the shards of its replacement pod
    # where that joined in the same round (a new replica: one replica's bytes, the greatest
    # common divisor of what every round sent).
    one_replica = math.gcd(*(sent for _, sent in by_round.values()))
    after_delete = [by_round[n] for n in sorted(by_round) if n > scaled["round"]]
    assert after_delete and all(sent <= one_replica for _, sent in after_delete), by_round
    # Every sequence exactly once per epoch (the last round's word for each), the loss falling.
    once = {int(epoch): word for epoch, word in EPOCH_LINE.findall(logs)}
    assert once == dict.fromkeys(range(EPOCHS), "True"), logs[-6000:]
    losses = [float(loss) for loss in STEP_LINE.findall(logs)]
    assert losses[-1] < 0.8 * losses[0], losses
    print(f"rounds (round, workers, from epoch, step): {rounds}; reshards (replicas, bytes "
          f"sent): {reshards}; loss {losses[0]:.3f} -> {losses[-1]:.3f}")  # fmt: skip


@pytest.mark.timeout(600)
def test_a_process_lost_inside_the_one_replica_of_an_hsdp_job_restarts_in_its_pod(
    operator: Cluster, kube: Kube, tmp_path: Path
) -> None:
    """One pod of two slots: HSDP down to one replica, which the copies of ``redundancy``
    protect. Its slot 1's process is SIGKILLed: dropping the pod would leave nobody, so the
    driver answers the pod's report with a restart (``slot_loss.py``). The pod keeps its
    container, slot 0 its process and shard, and a fresh process in slot 1 (forked from the
    pod's start server, torch imported) takes its shard from the copy slot 0 keeps; the job
    trains on at the same size and succeeds, every sequence trained exactly once per epoch."""
    kube.apply(sharded_job(replicas=1, maxReplicas=1))
    try:
        training = wait_training(kube, pods=1)
        (pod,) = (w["pod"] for w in training["workers"])
        kube.wait(
            "the pod's start server",
            lambda: START_SERVER_READY in kube.kubectl("logs", pod),
            timeout=60,
        )
        before = containers(kube)
        killed = kube.kubectl("exec", pod, "--", "python", "-c", KILL_ONE_SLOT)
        assert killed.strip(), "no process of the pod's second slot"
        recovered = wait_status(
            kube,
            JOB,
            "the pod training on at the same size after the SIGKILL",
            lambda s: trains_on(s, training, "resetCount", keeps=pod) and s["worldSize"] == 2,
            timeout=180,
        )
        assert containers(kube) == before, "the same container, never restarted"
        failed = worker_failed(kube)
        assert failed == [f"pod {pod}: slot 1 ended with -9, restarts in place (its slot's "
                          "restart moves 1/2 of a replica; dropping its host cannot keep "
                          "every shard)"], failed  # fmt: skip
        done, logs = succeeded(kube)
    finally:
        final = status(kube, JOB)
        stop_workers(kube, tmp_path)
    assert done["completionTime"], final
    assert "slot 1 ended with -9 and starts again: its slot's restart moves 1/2" in logs, logs
    assert "slot 1 starts forked from the start server (torch imported)" in logs, logs
    assert "slot 1 starts forked from the start server (torch imported)" in logs, logs
    by_round = {int(n): (int(replicas), int(sent)) for n, replicas, sent in RESHARDED.findall(logs)}
    restarted = [by_round[n] for n in sorted(by_round) if n > training["round"]]
    assert restarted and restarted[0][0] == 1 and restarted[0][1] > 0, by_round
    assert recovered["resetCount"] == training["resetCount"] + 1, recovered
    once = {int(epoch): word for epoch, word in EPOCH_LINE.findall(logs)}
    assert once == dict.fromkeys(range(EPOCHS), "True"), logs[-6000:]
