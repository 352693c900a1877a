"""horovodrun's elastic scenarios, run with horovodrun's flags through ``elasticjob-run``,
expecting what horovodrun gives (the cases of Horovod's own elastic integration tests: hosts
added and removed per epoch, one rank failing by exception or SIGKILL, every rank failing,
every host blacklisted, the reset limit).

The worker (``workers/horovod_scenario_worker.py``) writes one JSON line per epoch per rank;
as in Horovod's tests, the assertions read rank 0's line of each epoch: its start rank (the
rank it got when it started), the world size, its host and how many times it entered the
elastic training function (``rendezvous``: 1, plus one per reset).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.job_runs import WORKERS, JobRun, run_job

pytestmark = pytest.mark.integration

WORKER = WORKERS / "horovod_scenario_worker.py"
A, B = "127.0.1.1", "127.0.1.2"
EPOCHS = 3
JOB_TIMEOUT_S = 120.0


def run(
    tmp_path: Path,
    launcher_args: list[str],
    *,
    schedule: dict[int, str] | None = None,
    exits: dict[tuple[int, int], list[int]] | None = None,
    exit_mode: str = "exception",
    extra_worker_args: tuple[str, ...] = (),
) -> JobRun:
    worker_args = ["--epochs", str(EPOCHS), "--exit-mode", exit_mode, *extra_worker_args]
    if exits:
        exit_schedule = {f"{epoch},{batch}": ranks for (epoch, batch), ranks in exits.items()}
        worker_args += ["--exit-schedule", json.dumps(exit_schedule)]
    if schedule is not None:
        worker_args += ["--schedule", str(tmp_path / "schedule.json")]
    return run_job(
        tmp_path,
        launcher_args=[*launcher_args, "--log-level", "INFO"],
        worker_args=worker_args,
        schedule=schedule,
        timeout_s=JOB_TIMEOUT_S,
        script=WORKER,
    )


def results(job: JobRun) -> list[dict[str, Any]]:
    """Rank 0's line of each epoch (the last one written, should an epoch be run again)."""
    by_epoch = {e["epoch"]: e for e in job.events if e["rank"] == 0}
    assert sorted(by_epoch) == list(range(EPOCHS)), job.explain()
    return [by_epoch[epoch] for epoch in range(EPOCHS)]


def seen(line: dict[str, Any]) -> tuple[int, int, str, int]:
    return line["start_rank"], line["size"], line["hostname"], line["rendezvous"]


@pytest.mark.parametrize("slots", [2, 1])
def test_hosts_added_and_removed(tmp_path: Path, slots: int) -> None:
    """Discovery gives A, then A and B, then B alone: the job grows, then B's first process,
    which started as rank ``slots``, carries on as rank 0 (its host is the oldest left).
    Two slots per host come from ``--slots-per-host`` (the script prints bare host names)."""
    if slots == 2:
        flags, schedule = ["--slots-per-host", "2"], {0: A, 1: f"{A},{B}", 2: B}
    else:
        flags, schedule = [], {0: f"{A}:1", 1: f"{A}:1,{B}:1", 2: f"{B}:1"}
    np = str(slots)
    # horovodrun's --reset-limit counts every reset, failures or not: this schedule's two
    # (B added, then A removed) are within 2 (one fewer fails the job: the test below).
    job = run(
        tmp_path,
        ["-np", np, "--min-np", np, "--max-np", str(2 * slots), "--reset-limit", "2", *flags],
        schedule=schedule,
    )
    assert job.returncode == 0, job.explain()
    assert [seen(line) for line in results(job)] == [
        (0, slots, A, 1),
        (0, 2 * slots, A, 2),
        (slots, slots, B, 3),
    ]
    final = [e for e in job.events if e["epoch"] == EPOCHS - 1]
    assert sorted((e["rank"], e["start_rank"]) for e in final) == [
        (rank, slots + rank) for rank in range(slots)
    ]
    assert "job succeeded after 3 rounds" in job.stderr, job.explain()


def test_rank_0_waits_on_horovods_host_messages(tmp_path: Path) -> None:
    """Horovod's own elastic test script waits for a host change on rank 0 alone, polling
    Horovod's private ``state._host_messages.empty()``, then commits, which interrupts every
    rank: the same schedule as above gives the same epochs."""
    job = run(
        tmp_path,
        ["-np", "1", "--min-np", "1", "--max-np", "2"],
        schedule={0: f"{A}:1", 1: f"{A}:1,{B}:1", 2: f"{B}:1"},
        extra_worker_args=("--await-update", "host-messages"),
    )
    assert job.returncode == 0, job.explain()
    assert [seen(line) for line in results(job)] == [(0, 1, A, 1), (0, 2, A, 2), (1, 1, B, 3)]


@pytest.mark.parametrize(
    ("exit_mode", "hosts"),
    [("exception", "discovery"), ("sigkill", "-H")],
)
def test_single_rank_failure(tmp_path: Path, exit_mode: str, hosts: str) -> None:
    """Rank 0 fails at the start of epoch 1: its host is blacklisted, its host-mate leaves,
    and the other host's processes (start ranks 2 and 3) go on as ranks 0 and 1."""
    fixed = ["-H", f"{A}:2,{B}:2", "--blacklist-cooldown-range", "90", "180"]
    fixed = fixed if hosts == "-H" else []
    job = run(
        tmp_path,
        ["-np", "2", "--min-np", "2", "--max-np", "4", *fixed],
        schedule={0: f"{A}:2,{B}:2"} if hosts == "discovery" else None,
        exits={(1, 0): [0]},
        exit_mode=exit_mode,
    )
    assert job.returncode == 0, job.explain()
    assert [seen(line)[:2] + seen(line)[3:] for line in results(job)] == [
        (0, 4, 1),
        (2, 2, 2),
        (2, 2, 2),
    ]
    # The first blacklisting lasts the cooldown range's minimum. (Without the flag, horovodrun
    # keeps a failed host out for good; elasticjob-run's default range is 10 to 300 s.)
    cooldown = "for 90 s" if hosts == "-H" else "for 10 s"
    assert f"blacklisted host {A} {cooldown}" in job.stderr, job.explain()
    assert "job succeeded after 2 rounds and 1 resets" in job.stderr, job.explain()


def test_all_ranks_failing_fails_the_job(tmp_path: Path) -> None:
    job = run(
        tmp_path,
        ["-np", "2", "--min-np", "2", "--max-np", "4"],
        schedule={0: f"{A}:2,{B}:2"},
        exits={(1, 0): [0, 1, 2, 3]},
    )
    assert job.returncode == 1, job.explain()
    assert "job failed: all 4 workers failed" in job.stderr, job.explain()
    assert "scheduled exit at epoch 1 batch 0" in job.stderr


def test_every_host_blacklisted_fails_the_job(tmp_path: Path) -> None:
    """One process fails on each host: both hosts are blacklisted, none is left."""
    job = run(
        tmp_path,
        ["-np", "2", "--min-np", "2", "--max-np", "4"],
        schedule={0: f"{A}:2,{B}:2"},
        exits={(1, 0): [0, 2]},
    )
    assert job.returncode == 1, job.explain()
    assert "every discovered host is blacklisted" in job.stderr, job.explain()


def test_reset_limit_counts_every_reset(tmp_path: Path) -> None:
    """horovodrun's --reset-limit bounds how often the job scales up or down: the schedule
    below resets the job twice (B added, then A removed), with no failure, one more than 1
    (2 is enough: ``test_hosts_added_and_removed``)."""
    job = run(
        tmp_path,
        ["-np", "1", "--min-np", "1", "--max-np", "2", "--reset-limit", "1"],
        schedule={0: f"{A}:1", 1: f"{A}:1,{B}:1", 2: f"{B}:1"},
    )
    assert job.returncode == 1, job.explain()
    assert "reset limit 1 exceeded" in job.stderr, job.explain()
