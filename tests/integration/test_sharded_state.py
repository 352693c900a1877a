"""A model sharded with FSDP2 under ``hvd.elastic.ShardedState``, with real processes over Gloo
on loopback hosts: after a failure the survivors rebuild every shard from what they hold and
reshard it onto the new world; newcomers get their own rows; nobody rolls back on a graceful
change; shards that nobody holds fail the job with a message saying so.

The worker (``workers/sharded_worker.py``) logs, on rank 0 and for the tests only, a digest
of the whole gathered state at every commit and whenever training resumes: a round must
resume from the last commit, bit for bit, and every rank must end with the same state.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.sharded_runs import (
    FOUR_HOSTS,
    finished_alike,
    resumed_from_last_commit,
    run_sharded,
    shard_bytes,
)

pytestmark = pytest.mark.integration


def test_a_sigkilled_rank_of_four_is_rebuilt_from_its_copy_bit_for_bit_in_mixed_precision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bf16 compute and fp32 gradient reduction (``MixedPrecisionPolicy``): the committed
    shards are the fp32 parameters, rebuilt exactly after a SIGKILL. No survivor waits out
    the collective timeout (longer than the test's deadline) in one of FSDP2's own
    collectives: the survivors that see the failure let go of the broken group, which closes
    its connections and fails the others' collectives at once."""
    monkeypatch.setenv("ELASTICJOB_COLLECTIVE_TIMEOUT", "900")
    run = run_sharded(
        tmp_path,
        ["-np", "4", "--min-np", "3", "-H", FOUR_HOSTS],
        *("--mixed-precision", "--fail", "1:1:3"),
    )
    assert run.returncode == 0, run.explain()
    (resumed,) = resumed_from_last_commit(run)
    assert resumed["size"] == 3
    finished_alike(run, 3)


def test_a_lost_host_is_rebuilt_from_the_copies_on_the_other_host(tmp_path: Path) -> None:
    """Two ranks on each of two hosts: both ranks of one host fail (the host is lost, not
    one process), its host is blacklisted, and their shards come from the copies the other
    host keeps."""
    run = run_sharded(
        tmp_path,
        ["-np", "4", "--min-np", "2", "-H", "127.0.1.1:2,127.0.1.2:2"],
        *("--fail", "1:1:2", "--fail", "1:1:3"),
    )
    assert run.returncode == 0, run.explain()
    (resumed,) = resumed_from_last_commit(run)
    assert resumed["size"] == 2
    finished_alike(run, 2)


def test_a_rank_lost_inside_a_host_restarts_in_its_slot_and_only_its_shard_moves(
    tmp_path: Path,
) -> None:
    """Two ranks on each of two hosts, one copy each: rank 3 fails, its sibling lives on.
    Without its host the two ranks left would reshard half of the state; a fresh process in
    its slot takes a quarter, its shard, from the copy on the other host (the driver's plan,
    ``slot_loss.py``). The world keeps its four ranks, the host is not struck, and the three
    survivors keep their shards."""
    run = run_sharded(
        tmp_path,
        ["-np", "4", "--min-np", "2", "-H", "127.0.1.1:2,127.0.1.2:2"],
        *("--fail", "1:1:3", "--expect-sizes", "4,4"),
    )
    assert run.returncode == 0, run.explain()
    assert "worker 127.0.1.2[1] restarts in its slot: its slot's restart moves 1/4" in run.stderr
    (resumed,) = resumed_from_last_commit(run)
    assert (resumed["size"], resumed["sent_bytes"]) == (4, shard_bytes(4, 3)), resumed
    assert resumed["kept"], "rank 0 keeps its shard"
    finished_alike(run, 4)


def test_copies_live_on_another_node_than_their_rank(tmp_path: Path) -> None:
    """Three hosts (as pods are) on two nodes: the two ranks of one node die together, and
    the rank on the other node holds both their copies (were the copies placed by host, the
    first rank's copy would have died with the second)."""
    node_of_host = 'case "$ELASTICJOB_HOSTNAME" in 127.0.1.1) n=a;; *) n=b;; esac'
    run = run_sharded(
        tmp_path,
        ["-np", "3", "--min-np", "1", "-H", "127.0.1.1:1,127.0.1.2:1,127.0.1.3:1"],
        *("--fail", "1:1:1", "--fail", "1:1:2"),
        worker_prefix=["sh", "-c", f'{node_of_host}; ELASTICJOB_NODE=$n exec "$@"', "node"],
    )
    assert run.returncode == 0, run.explain()
    (resumed,) = resumed_from_last_commit(run)
    assert resumed["size"] == 1
    finished_alike(run, 1)


def test_a_commit_returns_before_its_copies_have_moved(tmp_path: Path) -> None:
    """The copies move on a thread of their own. With each commit's exchange held back 1.5 s,
    the first commit returns at once; the next one waits for the first's copies (one commit
    is in flight at most)."""
    run = run_sharded(
        tmp_path,
        ["-np", "2", "-H", "127.0.1.1:1,127.0.1.2:1"],
        *("--epochs", "1", "--slow-copies", "1.5"),
    )
    assert run.returncode == 0, run.explain()
    first, second, *_ = run.of("committed")
    assert first["returned_s"] < 0.5, first
    assert second["returned_s"] > 0.5 and second["previous_copies_s"] >= 1.5, second
    finished_alike(run, 2)


def test_two_failures_in_a_row_with_a_commit_between(tmp_path: Path) -> None:
    """The second failure is of the rank holding rank 0's copy: with one slot per host,
    rank 1 (the next host in the ring)."""
    hosts = FOUR_HOSTS + ",127.0.1.5:1"
    run = run_sharded(
        tmp_path,
        ["-np", "5", "--min-np", "3", "-H", hosts],
        *("--epochs", "3", "--fail", "1:1:4", "--fail", "2:1:1"),
    )
    assert run.returncode == 0, run.explain()
    first, second = resumed_from_last_commit(run)
    # The first failure's host comes back once its cooldown ends, so the second round may
    # be of 3 or of 4 again.
    assert first["size"] == 4 and second["size"] in (3, 4)
    finished_alike(run, second["size"])


def test_a_scale_out_gives_the_newcomer_its_rows_and_a_scale_in_rolls_nothing_back(
    tmp_path: Path,
) -> None:
    three = "127.0.1.1:1,127.0.1.2:1,127.0.1.3:1"
    run = run_sharded(
        tmp_path,
        ["-np", "3", "--min-np", "3", "--max-np", "4"],
        *("--epochs", "3", "--expect-sizes", "3,4,3"),
        schedule={0: three, 1: FOUR_HOSTS, 2: three},
    )
    assert run.returncode == 0, run.explain()
    out, back = resumed_from_last_commit(run)
    assert (out["size"], back["size"]) == (4, 3)
    finished_alike(run, 3)


MLP_BYTES = 3 * (8 * 30 + 30 + 30 * 3 + 3) * 4
"""The worker's sharded state: its MLP's parameters and AdamW's two moments, float32."""


def test_a_newcomer_is_placed_between_the_survivors_so_that_the_fewest_rows_move(
    tmp_path: Path,
) -> None:
    """Two ranks, no copies, then a third host. Placed last, the newcomer would take the last
    third from rank 1, and rank 1 a sixth from rank 0 (half of every tensor moved); the
    survivors told the driver which shards they hold, and the newcomer goes between them:
    each survivor keeps its new shard, the newcomer takes a sixth from each (a third)."""
    two = "127.0.1.1:1,127.0.1.2:1"
    run = run_sharded(
        tmp_path,
        ["-np", "2", "--min-np", "2", "--max-np", "3"],
        *("--redundancy", "0", "--epochs", "2", "--expect-sizes", "2,3"),
        schedule={0: two, 1: f"{two},127.0.1.3:1"},
    )
    assert run.returncode == 0, run.explain()
    assert "round 2: 3 workers on 127.0.1.1,127.0.1.3,127.0.1.2" in run.stderr, run.explain()
    (resumed,) = resumed_from_last_commit(run)
    assert (resumed["size"], resumed["sent_bytes"]) == (3, MLP_BYTES // 3), resumed
    finished_alike(run, 3)


def test_shards_nobody_holds_fail_the_job_and_say_how_to_keep_more(tmp_path: Path) -> None:
    run = run_sharded(
        tmp_path,
        ["-np", "4", "--min-np", "3", "-H", FOUR_HOSTS],
        *("--redundancy", "0", "--fail", "1:1:3"),
    )
    assert run.returncode != 0, run.explain()
    assert "the committed shards [3] of 4 are lost" in run.stderr
    assert "ShardedState(redundancy=...)" in run.stderr
