"""A sharded job end to end on devcluster: the FSDP2 language model example
(``examples/sharded_lm/train.py``, in the worker image built from this checkout) runs as an
ElasticJob of three worker pods; one pod's training process is SIGKILLed mid-training. The two
survivors keep their processes (same containers, no restart), rebuild the dead rank's shards
from the copies they hold in memory, reshard the last commit from three ranks onto two and
train on from it; the job succeeds, every sequence trained exactly once per epoch and the loss
falling. What happened is read from the pods' logs (rank 0's lines and the runtime's own)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from devcluster.cluster import Cluster
from tests.support.elastic_jobs import STARTUP_S, status, stop_workers, wait_status, worker_logs
from tests.support.kube import Kube

JOB = "sharded-lm"
WORKERS = f"elasticjob.dev/job-name={JOB}"
EPOCHS = 8
TRAIN = [
    *("python", "examples/sharded_lm/train.py"),
    *("--layers", "2", "--dim", "32", "--heads", "2", "--vocab", "32", "--seq-len", "16"),
    *("--samples", "384", "--batch-size", "8", "--epochs", str(EPOCHS)),
    *("--commit-every", "10", "--log-every", "5", "--pace", "0.1"),
]
"""A tiny model, paced so that the job trains for about half a minute after it starts (the
loss still falls to under half of its first value)."""
RESHARDED = re.compile(r"resharded commit \d+ from 3 shards onto [23] shards in 1 replica")
"""Onto the two survivors; onto three when the replacement pod joined the survivors' round
already (as when an operator that took the lead over found the killed pod gone)."""
ROUND_LINE = re.compile(r"round (\d+): (\d+) workers, from epoch (\d+) step (\d+)")
EPOCH_LINE = re.compile(r"epoch (\d+) done: .* exactly once: (True|False)")
STEP_LINE = re.compile(r"epoch \d+ step \d+: loss ([\d.]+)")


def sharded_job() -> dict[str, Any]:
    return {
        "apiVersion": "elasticjob.dev/v1alpha1",
        "kind": "ElasticJob",
        "metadata": {"name": JOB},
        "spec": {
            "replicas": 3,
            "minReplicas": 2,
            "maxReplicas": 3,
            "backend": "gloo",
            # Only the killed pod is kept out: with the default (its node), a pod that shared
            # the node would leave too, and the job would go on with one survivor.
            "blacklist": {"scope": "Pod", "cooldownSeconds": {"min": 300, "max": 600}},
            "cleanPodPolicy": "None",  # the pods and their logs stay for the checks
            # A bound on any collective: none should reach it (the state lets go of a broken
            # group, which fails the survivors' collectives at once).
            "collectiveTimeoutSeconds": 20,
            "template": {
                "spec": {
                    "terminationGracePeriodSeconds": 10,
                    "containers": [
                        {"name": "worker", "image": "elasticjob/worker:0.1.0", "command": TRAIN}
                    ],
                }
            },
        },
    }


def containers(kube: Kube) -> dict[str, tuple[str, int]]:
    """Each worker pod's container: its ID and restart count, by pod name."""
    found = {}
    for pod in kube.pods(WORKERS):
        for c in pod.get("status", {}).get("containerStatuses", []):
            found[pod["metadata"]["name"]] = (c.get("containerID", ""), c.get("restartCount", 0))
    return found


@pytest.mark.timeout(900)
def test_a_sigkilled_worker_pod_of_a_sharded_job_is_rebuilt_from_memory(
    operator: Cluster, kube: Kube, tmp_path: Path
) -> None:
    kube.apply(sharded_job())
    try:
        training = wait_status(
            kube,
            JOB,
            "training with 3 workers",
            lambda s: (
                s.get("phase") == "Running"
                and s.get("worldSize") == 3
                and s.get("progress") is not None
                and (s["progress"]["epoch"], s["progress"]["step"]) >= (0, 10)
            ),
            STARTUP_S,
        )
        victim = next(w for w in training["workers"] if 0 not in w["ranks"])
        survivors = {w["pod"] for w in training["workers"]} - {victim["pod"]}
        before = containers(kube)
        kube.cluster.faults.kill(victim["pod"], kube.ns)
        killed = time.monotonic()
        recovered = wait_status(
            kube,
            JOB,
            "two survivors training on after the SIGKILL",
            lambda s: (
                s.get("resetCount", 0) > training["resetCount"]
                and s.get("phase") == "Running"
                and s.get("worldSize", 0) >= 2
                and survivors <= {w["pod"] for w in s.get("workers", [])}
            ),
            timeout=180,
        )
        recovery_s = time.monotonic() - killed
        after = containers(kube)
        for pod in survivors:  # the same container, never restarted: the same process
            assert after[pod] == before[pod] and after[pod][1] == 0, (before, after)
        done = wait_status(kube, JOB, "success", lambda s: s.get("phase") == "Succeeded", 300)
        logs = worker_logs(kube)
    finally:
        final = status(kube, JOB)
        stop_workers(kube, tmp_path)
    assert done["completionTime"], final
    assert recovered["round"] > training["round"]
    # The survivors resharded the commit of 3 ranks and resumed from it, not from 0.
    assert RESHARDED.search(logs), logs[-6000:]
    rounds = [tuple(map(int, m.groups())) for m in ROUND_LINE.finditer(logs)]
    resumed = [r for r in rounds if r[0] > training["round"]]
    assert resumed and (resumed[0][2], resumed[0][3]) > (0, 0), rounds
    # Every sequence exactly once per epoch (the last round's word for each), the loss falling.
    once = {int(epoch): word for epoch, word in EPOCH_LINE.findall(logs)}
    assert once == dict.fromkeys(range(EPOCHS), "True"), logs[-6000:]
    losses = [float(loss) for loss in STEP_LINE.findall(logs)]
    assert losses[-1] < 0.8 * losses[0], losses
    print(f"recovered in {recovery_s:.1f} s (status polled); rounds (round, workers, "
          f"from epoch, step): {rounds}; {RESHARDED.findall(logs)}; "
          f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")  # fmt: skip
