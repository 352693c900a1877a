"""Suspending a job with real processes: ``elasticjob-run`` suspends on SIGUSR1 (a batch
scheduler's warning before preemption), its workers stop at the same step, rank 0 writes the
last commit as a checkpoint, every process exits, and the same command resumes from it: no
step is lost or trained twice, and every sample is trained once per epoch."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from elasticjob.launcher.run_command import EXIT_SUSPENDED
from tests.support.job_runs import (
    EPOCHS,
    SAMPLES,
    JobRun,
    assert_trained_exactly_once,
    run_job,
    worker_args,
)

pytestmark = pytest.mark.integration

SUSPEND_AT = (1, 5)
"""(epoch, batch) at which rank 0 sends the launcher SIGUSR1."""
BATCH_SIZE = 4
WORKERS = 2


def launch(tmp_path: Path, folder: Path | None) -> JobRun:
    # Only the suspension's checkpoint: none is due before.
    checkpoints = [] if folder is None else ["--checkpoint-dir", str(folder)]
    checkpoints += [] if folder is None else ["--checkpoint-every-commits", "1000"]
    epoch, batch = SUSPEND_AT
    return run_job(
        tmp_path,
        launcher_args=[
            *("-np", str(WORKERS), "-H", f"127.0.1.1:{WORKERS}"),
            *checkpoints,
            # Rank 0 signals its parent, the launcher: started cold (also the test of elastic
            # mode's cold starts), not forked from the start server.
            "--no-warm-start",
        ],
        # Steps slow enough that the job is still training when the notice arrives.
        worker_args=worker_args("--fail", f"{epoch}:{batch}:0:suspend", "--step-time", "0.05"),
    )


def rank0_steps(run: JobRun, since: float = 0.0) -> list[tuple[int, int]]:
    return [
        (e["epoch"], e["batch"]) for e in run.of("step") if e["rank"] == 0 and e["time"] >= since
    ]


def test_a_suspended_job_resumes_from_its_last_commit(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    first = launch(tmp_path, folder)
    assert first.returncode == EXIT_SUSPENDED, first.explain()
    assert "job suspended: the 2 workers of round 1 stopped" in first.stderr, first.explain()
    assert not first.of("done"), "no worker finished training"
    written = [p.name for p in folder.iterdir()]
    assert len(written) == 1, written  # the suspension's, nothing periodic
    suspended_at = rank0_steps(first)
    assert suspended_at[-1] >= SUSPEND_AT

    second_started = time.time()
    second = launch(tmp_path, folder)  # the SIGUSR1 fired once: this run trains to the end
    assert second.returncode == 0, second.explain()
    loaded = re.findall(r"loaded checkpoint (\S+) \(epoch \d+, step (\d+)", second.stdout)
    assert [name for name, _ in loaded] == written, second.explain()
    assert_trained_exactly_once(second)
    resumed = rank0_steps(second, since=second_started)
    assert not set(resumed) & set(suspended_at), "a step trained before the suspension again"
    per_epoch = SAMPLES // (BATCH_SIZE * WORKERS)
    every_step = {(epoch, batch) for epoch in range(EPOCHS) for batch in range(per_epoch)}
    assert set(suspended_at) | set(resumed) == every_step, "a step was lost"


def test_a_job_without_checkpoints_says_it_starts_afresh(tmp_path: Path) -> None:
    run = launch(tmp_path, None)
    assert run.returncode == EXIT_SUSPENDED, run.explain()
    assert "without --checkpoint-dir, the same command starts it afresh" in run.stderr
    assert run.of("start") and not run.of("done"), run.explain()
