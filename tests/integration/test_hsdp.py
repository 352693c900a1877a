"""HSDP under ``hvd.elastic.ShardedState(..., hsdp=True)``: each host's two ranks shard the
state, the hosts replicate it; real processes over Gloo on loopback hosts. A lost host costs
its replica only (nothing moves), new hosts are new replicas that take one replica's shards;
after every change the state resumed is the last commit bit for bit, every sample is trained
once an epoch, and the replicas end alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.sharded_runs import (
    finished_alike,
    resumed_from_last_commit,
    run_sharded,
    trained_once_in_identical_replicas,
)

pytestmark = pytest.mark.integration

TWO_PODS = "127.0.1.1:2,127.0.1.2:2"
ONE_REPLICA_BYTES = 3 * (8 * 30 + 30 + 30 * 3 + 3) * 4
"""The worker's sharded state: its MLP's parameters and AdamW's two moments, float32."""
KEEP_FAILED_HOSTS_OUT = ["--blacklist-cooldown-range", "600", "600"]


def test_a_lost_pod_moves_nothing_and_two_new_pods_take_one_replicas_shards(
    tmp_path: Path,
) -> None:
    """2 pods x 2 slots; one process of the second pod is SIGKILLed, its host goes with it
    (1 x 2); two more pods join (3 x 2)."""
    run = run_sharded(
        tmp_path,
        ["-np", "4", "--min-np", "2", "--max-np", "6", *KEEP_FAILED_HOSTS_OUT],
        *("--hsdp", "--epochs", "3", "--fail", "1:1:3", "--expect-sizes", "4,2,6"),
        schedule={0: TWO_PODS, 2: "127.0.1.1:2,127.0.1.2:2,127.0.1.3:2,127.0.1.4:2"},
    )
    assert run.returncode == 0, run.explain()
    lost, grown = resumed_from_last_commit(run)
    assert (lost["size"], grown["size"]) == (2, 6)
    assert lost["sent_bytes"] == 0, lost  # the lost replica's shards are in the other
    assert grown["sent_bytes"] == 2 * ONE_REPLICA_BYTES, grown  # and nothing else
    finished_alike(run, 6)
    trained_once_in_identical_replicas(run, epochs=3, replicas=3)


def test_a_kill_in_each_replica_in_turn(tmp_path: Path) -> None:
    """3 pods x 2 slots: a process of the first replica (rank 0's) dies, then one of the
    last; each time the other replicas go on from the last commit."""
    run = run_sharded(
        tmp_path,
        ["-np", "6", "--min-np", "2", "-H", "127.0.1.1:2,127.0.1.2:2,127.0.1.3:2",
         *KEEP_FAILED_HOSTS_OUT],
        *("--hsdp", "--epochs", "3", "--fail", "1:1:1", "--fail", "2:1:3"),
    )  # fmt: skip
    assert run.returncode == 0, run.explain()
    first, second = resumed_from_last_commit(run)
    assert (first["size"], second["size"]) == (4, 2)
    finished_alike(run, 2)
    trained_once_in_identical_replicas(run, epochs=3, replicas=1)
