"""Jobs of the sharded-state worker (``tests/integration/workers/sharded_worker.py``) and what
they must show: every round after the first resumed from the newest commit before it, bit for
bit, and every rank ended with the same state."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from elasticjob.worker_runtime.elastic.sharded.shard_plan import RowLayout
from tests.support.job_runs import WORKERS, JobRun, run_job

SHARDED_WORKER = WORKERS / "sharded_worker.py"
FOUR_HOSTS = "127.0.1.1:1,127.0.1.2:1,127.0.1.3:1,127.0.1.4:1"
MLP_SHAPES = ((30, 8), (30,), (3, 30), (3,))
"""The shapes of the worker's MLP's parameters (8 features, 30 hidden, 3 outputs)."""


def shard_bytes(shards: int, shard: int) -> int:
    """The bytes of shard ``shard`` of ``shards`` of the worker's sharded state: its MLP's
    parameters and AdamW's two moments, float32, split as FSDP2 splits them."""
    rows = (RowLayout(shape[0], shards).span(shard) for shape in MLP_SHAPES)
    sizes = (math.prod(shape[1:]) for shape in MLP_SHAPES)
    spans = zip(rows, sizes, strict=True)
    return 3 * 4 * sum((stop - start) * size for (start, stop), size in spans)


def run_sharded(
    tmp_path: Path,
    launcher_args: list[str],
    *worker_args: str,
    schedule: dict[int, str] | None = None,
    worker_prefix: Sequence[str] = (),
) -> JobRun:
    """Run a job of the sharded-state worker to its end (see :func:`run_job`)."""
    return run_job(
        tmp_path,
        launcher_args=launcher_args,
        worker_args=list(worker_args),
        schedule=schedule,
        script=SHARDED_WORKER,
        worker_prefix=worker_prefix,
    )


def resumed_from_last_commit(run: JobRun) -> list[dict[str, Any]]:
    """Check that every round after the first resumed from the newest commit made before it
    (bit for bit); return those resumptions."""
    commits = run.of("commit")
    later = [e for e in run.of("resumed") if e["round"] > 1]
    for resumed in later:
        before = [c for c in commits if c["round"] < resumed["round"]]
        assert before, f"round {resumed['round']} resumed before any commit: {run.explain()}"
        last = max(before, key=lambda c: c["time"])
        assert (resumed["epoch"], resumed["batch"]) == (last["epoch"], last["batch"]), resumed
        assert resumed["digest"] == last["digest"], "the resumed state is not the last commit"
    return later


def finished_alike(run: JobRun, size: int) -> None:
    done = run.of("done")
    assert len(done) == size and len({d["digest"] for d in done}) == 1, done


def trained_once_in_identical_replicas(run: JobRun, epochs: int, replicas: int) -> None:
    """Every sample trained once an epoch in the committed trajectory, and the ranks that
    hold one shard in the ``replicas`` replicas hold it alike."""
    done = run.of("done")
    for d in done:
        assert (d["seen_min"], d["seen_max"]) == (epochs, epochs), d
        assert d["replicas"] == replicas, d
    by_shard: dict[int, set[str]] = {}
    for d in done:
        by_shard.setdefault(d["shard"], set()).add(d["shard_digest"])
    assert all(len(digests) == 1 for digests in by_shard.values()), by_shard
    assert all(sum(d["shard"] == shard for d in done) == replicas for shard in by_shard), done
