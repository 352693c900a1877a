"""HSDP under ``hvd.elastic.ShardedState(..., hsdp=True)``: each host's two ranks shard the
state, the hosts (pods) replicate it; real processes over Gloo on loopback hosts. A lost host costs
its replica only (nothing moves), new hosts are new replicas that take one replica's shards;
after every change the state resumed is the last commit bit for bit, every sample is trained
once an epoch, and the replicas end alike."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import pytest

from elasticjob.worker_contract import ENV_COLLECTIVE_TIMEOUT
from tests.support.sharded_runs import (
    finished_alike,
    resumed_from_last_commit,
    run_sharded,
    shard_bytes,
    trained_once_in_identical_replicas,
)

pytestmark = pytest.mark.integration

THREE_PODS = "127.0.1.1:2,127.0.1.2:2,127.0.1.3:2"
ONE_REPLICA_BYTES = 3 * (8 * 30 + 30 + 30 * 3 + 3) * 4
"""The worker's sharded state: its MLP's parameters and AdamW's two moments, float32."""
KEEP_FAILED_HOSTS_OUT = ["--blacklist-cooldown-range", "600", "600"]


def test_pods_lost_from_each_replica_in_turn_then_two_new_pods(tmp_path: Path) -> None:
    """3 pods x 2 slots. A process of the first replica (rank 0's pod) is SIGKILLed, its
    pod goes with it (2 x 2); then one of the last replica (1 x 2); then two pods join
    (3 x 2). A lost pod sends nothing; the two new ones receive one replica's shards each,
    from the one replica left, and nothing else moves."""
    run = run_sharded(
        tmp_path,
        ["-np", "6", "--min-np", "2", "--max-np", "6", *KEEP_FAILED_HOSTS_OUT],
        *("--hsdp", "--epochs", "4", "--fail", "1:1:1", "--fail", "2:1:3"),
        *("--expect-sizes", "6,4,2,6"),
        schedule={0: THREE_PODS, 3: f"{THREE_PODS},127.0.1.4:2,127.0.1.5:2"},
    )
    assert run.returncode == 0, run.explain()
    resumed = resumed_from_last_commit(run)
    assert [r["size"] for r in resumed] == [4, 2, 6], resumed
    assert [r["sent_bytes"] for r in resumed] == [0, 0, 2 * ONE_REPLICA_BYTES], resumed
    assert all(r["kept"] for r in resumed), "rank 0 keeps its shard: its commit, no snapshot"
    finished_alike(run, 6)
    trained_once_in_identical_replicas(run, epochs=4, replicas=3)


def test_down_to_one_replica_a_rank_lost_inside_its_pod_restarts_in_its_slot(
    tmp_path: Path,
) -> None:
    """2 pods x 2 slots. A process of the second pod fails: the other pod is a whole replica,
    so its pod goes and nothing moves (1 x 2). Then a process of the one replica left fails:
    dropping its pod would leave nobody, so its slot restarts in place, its sibling keeping
    its process and shard, and the fresh process takes its shard from the copy the sibling
    keeps (the copies of ``redundancy`` protect a single replica). A new pod then brings the
    job back to two replicas (2 x 2)."""
    two = "127.0.1.1:2,127.0.1.2:2"
    run = run_sharded(
        tmp_path,
        ["-np", "4", "--min-np", "2", "--max-np", "4", *KEEP_FAILED_HOSTS_OUT],
        *("--hsdp", "--epochs", "4", "--fail", "1:1:3", "--fail", "2:1:1"),
        *("--expect-sizes", "4,2,2,4"),
        schedule={0: two, 3: f"{two},127.0.1.3:2"},
    )
    assert run.returncode == 0, run.explain()
    assert "worker 127.0.1.1[1] restarts in its slot" in run.stderr, run.explain()
    assert "127.0.1.1[0] of round" not in run.stderr, "the sibling never failed"
    resumed = resumed_from_last_commit(run)
    assert [r["size"] for r in resumed] == [2, 2, 4], resumed
    sent = [r["sent_bytes"] for r in resumed]
    assert sent == [0, shard_bytes(2, 1), ONE_REPLICA_BYTES], resumed
    assert all(r["kept"] for r in resumed), "rank 0 keeps its shard throughout"
    finished_alike(run, 4)
    trained_once_in_identical_replicas(run, epochs=4, replicas=2)


def test_a_pod_killed_while_leaving_in_the_middle_of_a_sync_fails_the_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2 pods x 2 slots, a third pod joins (3 x 2); its processes, syncing, are told their
    pod leaves and die before the round releases them (a pod deleted with a short grace
    period), while the others form the device mesh's groups with them. The round fails (the
    leaver's host is not to blame) and the survivors give up forming those groups at once,
    not at the collective timeout (beyond the job's deadline here): the job goes on as
    2 x 2 from the last commit."""
    monkeypatch.setenv(ENV_COLLECTIVE_TIMEOUT, "900")
    two_pods = "127.0.1.1:2,127.0.1.2:2"
    run = run_sharded(
        tmp_path,
        ["-np", "4", "--min-np", "2", "--max-np", "6", *KEEP_FAILED_HOSTS_OUT],
        *("--hsdp", "--epochs", "3", "--leave-in-sync", "127.0.1.3:2"),
        *("--hold-until-round", "1:3"),  # epoch 1 ends once the third pod came and went
        schedule={0: two_pods, 1: f"{two_pods},127.0.1.3:2"},
    )
    assert run.returncode == 0, run.explain()
    # Either of the pod's two processes may be the first to end (the driver blames the round
    # on that one).
    assert re.search(
        r"leaving worker 127\.0\.1\.3\[[01]\] ended before round 2 released it", run.stderr
    ), run.explain()
    resumed = resumed_from_last_commit(run)
    assert [(r["round"], r["size"]) for r in resumed] == [(3, 4)], resumed
    finished_alike(run, 4)
    trained_once_in_identical_replicas(run, epochs=3, replicas=2)


def test_a_process_lost_inside_fsdp2s_collectives_costs_its_replica_not_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2 pods x 2 slots. A process of the second pod stops as on a lost node (every thread
    stops; killed, no reset reaches its peers) as the others enter a step: they wait for it
    inside FSDP2's all-gathers and all-reduces, which torch waits for itself. The driver
    finds it silent, kills it and fails the round; the survivors' waits end with the round,
    not at the collective timeout (beyond the job's deadline here), and the job goes on as
    1 x 2 from the last commit."""
    monkeypatch.setenv(ENV_COLLECTIVE_TIMEOUT, "900")
    release = tmp_path / "release-frozen"
    try:
        run = run_sharded(
            tmp_path,
            ["-np", "4", "--min-np", "2", "-H", "127.0.1.1:2,127.0.1.2:2", *KEEP_FAILED_HOSTS_OUT],
            *("--hsdp", "--epochs", "2", "--expect-sizes", "4,2"),
            *("--freeze", "1:1:3", "--release-frozen", str(release)),
        )
    finally:
        release_frozen(release)
    assert run.returncode == 0, run.explain()
    assert "worker 127.0.1.2[1] sent no heartbeat" in run.stderr, run.explain()
    resumed = resumed_from_last_commit(run)
    assert [(r["round"], r["size"]) for r in resumed] == [(2, 2)], resumed
    # Its silence (5 s) is noticed, it is killed, the round re-forms and resumes.
    frozen_at = run.of("freeze")[0]["time"]
    resumed_after = resumed[0]["time"] - frozen_at
    assert resumed_after < 30, f"resumed {resumed_after:.1f} s after"
    finished_alike(run, 2)
    trained_once_in_identical_replicas(run, epochs=2, replicas=1)


def release_frozen(fifo: Path) -> None:
    """Let the frozen process's sockets go (its holder reads the FIFO), if it still holds
    them."""
    with contextlib.suppress(OSError):  # nobody holds them: none, or gone
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
