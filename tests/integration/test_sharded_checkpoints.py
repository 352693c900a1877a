"""Durable checkpoints of ``hvd.elastic.ShardedState`` in ``torch.distributed.checkpoint``
format, with real processes over Gloo on loopback hosts: lost shards fall back to the newest
checkpoint; a checkpoint loads with standard tools, whole, in one process; and a fresh job that
loads a commit's checkpoint onto the new world size reaches, after the same steps, the same
parameters bit for bit as the survivors that rebuilt that commit from memory.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from elasticjob.launcher.run_command import EXIT_SUSPENDED
from tests.support.sharded_runs import (
    FOUR_HOSTS,
    finished_alike,
    resumed_from_last_commit,
    run_sharded,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled"),
]

THREE_HOSTS = "127.0.1.1:1,127.0.1.2:1,127.0.1.3:1"
EVERY_1000_COMMITS = ("--checkpoint-every-commits", "1000")
"""A policy that writes no checkpoint in a short job: the suspension's is the only one."""


def checkpoint_args(folder: Path, keep: int = 3) -> list[str]:
    return [
        *("--checkpoint-dir", str(folder)),
        *("--checkpoint-every-commits", "1", "--checkpoint-keep", str(keep)),
    ]


def counters(checkpoint: Path) -> dict[str, Any]:
    """A checkpoint's ``epoch`` and ``batch`` attributes and its meta, read in this process
    (no process group) with DCP's own loader."""
    state: dict[str, Any] = {
        "extras": {"epoch": 0, "batch": 0},
        "meta": {"epoch": 0, "step": 0, "round": 0, "commit": 0},
    }
    dcp_load(state, checkpoint_id=checkpoint, no_dist=True)
    return {**state["extras"], **state["meta"]}


def test_lost_shards_fall_back_to_the_newest_durable_checkpoint(tmp_path: Path) -> None:
    """Without copies, a rank's death loses its shards; the checkpoint written at every commit
    (every rank writes its own shards) brings the job back, on the new world, from the last
    commit; the folder holds plain DCP checkpoints that load whole in a single process."""
    folder = tmp_path / "checkpoints"
    run = run_sharded(
        tmp_path,
        ["-np", "4", "--min-np", "3", "-H", FOUR_HOSTS, *checkpoint_args(folder)],
        *("--redundancy", "0", "--fail", "1:1:3"),
    )
    assert run.returncode == 0, run.explain()
    assert "training goes on from the newest durable checkpoint" in run.stdout
    (resumed,) = resumed_from_last_commit(run)
    assert resumed["size"] == 3
    finished_alike(run, 3)

    names = sorted(p.name for p in folder.iterdir())
    assert len(names) == 3 and all(not n.endswith(".tmp") for n in names), names
    newest = folder / names[-1]
    model = {
        "0.weight": torch.zeros(30, 8),
        "0.bias": torch.zeros(30),
        "2.weight": torch.zeros(3, 30),
        "2.bias": torch.zeros(3),
    }
    dcp_load({"model": model}, checkpoint_id=newest, no_dist=True)
    assert all(t.abs().sum() > 0 and t.isfinite().all() for t in model.values())
    assert counters(newest)["epoch"] == 2  # the last commit: after the last epoch


def test_a_newcomer_writes_the_checkpoint_that_falls_due_with_the_others(
    tmp_path: Path,
) -> None:
    """A checkpoint every 10 commits. Two hosts commit 4 to 8 times before a third joins
    (at one of epoch 1's commits); the newcomer takes rank 0's count at the round's sync, so
    the checkpoint that falls due a few commits later is written by every rank together. A
    newcomer counting from 0 would skip it, and the others would wait in the write's
    collective until the timeout, then roll back."""
    folder = tmp_path / "checkpoints"
    two = "127.0.1.1:1,127.0.1.2:1"
    run = run_sharded(
        tmp_path,
        [
            *("-np", "2", "--min-np", "2", "--max-np", "3", "--checkpoint-dir", str(folder)),
            *("--checkpoint-every-commits", "10", "--checkpoint-keep", "3"),
        ],
        *("--epochs", "4", "--expect-sizes", "2,3,3,3"),
        schedule={0: two, 1: f"{two},127.0.1.3:1"},
    )
    assert run.returncode == 0, run.explain()
    (scaled_out,) = resumed_from_last_commit(run)
    assert scaled_out["size"] == 3, "one round after the first: nothing rolled back"
    finished_alike(run, 3)
    names = sorted(p.name for p in folder.iterdir())
    assert names and counters(folder / names[-1])["round"] == 2, names


def test_a_dcp_reload_of_the_same_commit_reaches_the_same_parameters(tmp_path: Path) -> None:
    """The survivors of a SIGKILL rebuild commit C from memory onto 3 ranks and train on; a
    fresh 3-rank job that loads C's DCP checkpoint trains the same steps: both end with the
    same state, bit for bit."""
    elastic, fresh = tmp_path / "elastic", tmp_path / "fresh"
    elastic.mkdir()
    fresh.mkdir()
    run = run_sharded(
        elastic,
        ["-np", "4", "--min-np", "3", "-H", FOUR_HOSTS, *checkpoint_args(elastic / "ckpt", 100)],
        "--fail",
        "1:1:3",
    )
    assert run.returncode == 0, run.explain()
    (resumed,) = resumed_from_last_commit(run)
    assert resumed["size"] == 3
    finished_alike(run, 3)

    by_counters = {
        (c["epoch"], c["batch"]): path
        for path in (elastic / "ckpt").iterdir()
        if (c := counters(path))["round"] == 1
    }
    commit = by_counters[(resumed["epoch"], resumed["batch"])]
    shutil.copytree(commit, fresh / "ckpt" / commit.name)
    reloaded = run_sharded(
        fresh, ["-np", "3", "--min-np", "3", "-H", THREE_HOSTS, *checkpoint_args(fresh / "ckpt")]
    )
    assert reloaded.returncode == 0, reloaded.explain()
    (first,) = reloaded.of("resumed")
    assert (first["epoch"], first["batch"], first["digest"]) == (
        resumed["epoch"],
        resumed["batch"],
        resumed["digest"],
    )
    finished_alike(reloaded, 3)
    assert reloaded.of("done")[0]["digest"] == run.of("done")[0]["digest"]


def test_a_suspended_sharded_job_resumes_its_last_commit_on_another_world(
    tmp_path: Path,
) -> None:
    """A suspension writes the last commit of a sharded state, every rank its own shards;
    the job resumed on fewer ranks starts from that commit, bit for bit, and trains to the
    end."""
    folder = tmp_path / "checkpoints"
    suspended = run_sharded(
        tmp_path,
        # Rank 0 signals its parent, the launcher: started cold, not forked from the server.
        [
            *("-np", "3", "-H", THREE_HOSTS, "--no-warm-start"),
            *("--checkpoint-dir", str(folder), *EVERY_1000_COMMITS),
        ],
        *("--suspend-at", "1:1"),
    )
    assert suspended.returncode == EXIT_SUSPENDED, suspended.explain()
    assert not suspended.of("done")
    (written,) = list(folder.iterdir())  # the suspension's alone: no policy made one before
    last = max(suspended.of("commit"), key=lambda c: c["time"])
    assert (counters(written)["epoch"], counters(written)["batch"]) == (
        last["epoch"],
        last["batch"],
    )

    resumed_run = run_sharded(
        tmp_path, ["-np", "2", "-H", "127.0.1.1:1,127.0.1.2:1", *checkpoint_args(folder)]
    )
    assert resumed_run.returncode == 0, resumed_run.explain()
    first = next(e for e in resumed_run.of("resumed") if e["time"] > last["time"])
    assert (first["epoch"], first["batch"], first["digest"]) == (
        last["epoch"],
        last["batch"],
        last["digest"],
    )
    assert (first["size"], len([d for d in resumed_run.of("done")])) == (2, 2)
