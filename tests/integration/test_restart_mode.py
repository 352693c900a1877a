"""Restart mode under ``elasticjob-run --mode restart``: an unchanged torchrun DDP script
(``workers/restart_worker.py``, which resumes from its own checkpoint) survives a SIGKILL and
a scale-out and finishes; a script that fails on every rank fails the job once, with its exit
code and its last lines; the restart budget ends a job that keeps failing. (An unchanged
PyTorch Lightning script through the same kill and scale-out: tests/e2e/test_operator.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.job_runs import WORKERS, JobRun, run_job

pytestmark = pytest.mark.integration

SCRIPT = WORKERS / "restart_worker.py"
TWO_HOSTS = ["-np", "2", "-H", "127.0.1.1:1,127.0.1.2:1"]


def run_restart_job(
    tmp_path: Path,
    launcher_args: list[str],
    *script_args: str,
    schedule: dict[int, str] | None = None,
) -> JobRun:
    return run_job(
        tmp_path,
        launcher_args=["--mode", "restart", *launcher_args],
        worker_args=["--checkpoint", str(tmp_path / "ckpt.pt"), *script_args],
        script=SCRIPT,
        schedule=schedule,
    )


def starts_by_rank(run: JobRun) -> dict[int, list[dict[str, Any]]]:
    starts: dict[int, list[dict[str, Any]]] = {}
    for start in run.of("start"):
        starts.setdefault(start["rank"], []).append(start)
    return starts


def assert_finished_together(run: JobRun, size: int) -> None:
    done = run.of("done")
    assert sorted(d["rank"] for d in done) == list(range(size)), run.explain()
    assert {d["size"] for d in done} == {size}
    assert len({d["digest"] for d in done}) == 1, f"ranks disagree: {done}"


def test_a_sigkilled_script_is_started_again_with_every_other_and_a_scale_out_again(
    tmp_path: Path,
) -> None:
    """Rank 1's script SIGKILLs itself at epoch 1 (3 s an epoch): both scripts start again in
    their slots, in a fresh store, as torchrun's next attempt, and resume from their
    checkpoint. At epoch 2 a third host comes, and the scripts, held there until the world
    is 3, start again in it, the newcomer's host last. Each start is forked from the agent's
    start server, where torch is imported already (cold starts, with ``--no-warm-start``:
    the test of a script failing on every rank)."""
    two = "127.0.1.1:1,127.0.1.2:1"
    run = run_job(
        tmp_path,
        launcher_args=["--mode", "restart", "-np", "2", "--min-np", "2", "--max-np", "3"],
        worker_args=[
            *("--checkpoint", str(tmp_path / "ckpt.pt"), "--epochs", "3", "--steps", "30"),
            *("--step-s", "0.1", "--fail-at", "1:0:1:sigkill", "--await-size", "2:3"),
        ],
        script=SCRIPT,
        schedule={0: two, 2: f"{two},127.0.1.3:1"},
    )
    assert run.returncode == 0, run.explain()
    assert_finished_together(run, 3)
    starts = starts_by_rank(run)
    assert [len(starts[r]) for r in (0, 1, 2)] == [3, 3, 1]
    assert all(s["warm"] for r in starts for s in starts[r])
    assert "the script starts forked from the start server" in run.stdout
    assert all(s["argv"][0] == str(SCRIPT) for r in starts for s in starts[r])
    first, second, third = ([starts[r][k] for r in (0, 1)] for k in (0, 1, 2))
    assert {(s["epoch"], s["step"]) for s in second} == {(1, 0)}, "from the checkpoint"
    assert {s["env"]["TORCHELASTIC_RESTART_COUNT"] for s in first} == {"0"}
    assert {s["env"]["TORCHELASTIC_RUN_ID"] for r in starts for s in starts[r]} == {"local"}
    assert {s["env"]["TORCHELASTIC_RESTART_COUNT"] for s in second} == {"1"}
    ports = [{s["env"]["MASTER_PORT"] for s in starts_of} for starts_of in (first, second)]
    assert len(ports[0]) == len(ports[1]) == 1 and ports[0] != ports[1], "a fresh store"
    assert not any(name.startswith("ELASTICJOB_") for s in first for name in s["env"]), (
        "the script is no worker of the rendezvous: it gets neither its token nor its address"
    )
    final = [*third, starts[2][0]]
    assert {(s["size"], s["epoch"], s["step"]) for s in final} == {(3, 2, 0)}
    assert final[2]["env"]["GROUP_RANK"] == "2", "the newcomer's host goes last"
    assert [s["env"]["TORCHELASTIC_RESTART_COUNT"] for s in final] == ["1", "1", "0"], (
        "adding a host is no failure restart, as under torchrun"
    )
    assert "the script of worker 127.0.1.2[0] failed (killed by SIGKILL)" in run.stderr
    assert "succeeded after 3 rounds and 2 resets" in run.stderr


def test_a_script_failing_on_every_rank_fails_the_job_once_with_its_exit_code(
    tmp_path: Path,
) -> None:
    """Started cold (``--no-warm-start``): each script in a fresh interpreter."""
    run = run_restart_job(tmp_path, ["--no-warm-start", *TWO_HOSTS], "--fail-at", "0:1:all:exit-3")
    assert run.returncode == 1, run.explain()
    starts = starts_by_rank(run)
    assert [len(s) for s in starts.values()] == [1, 1], "no restart loop"
    assert not any(s["warm"] for r in starts for s in starts[r])
    assert all(s["argv"][0] == str(SCRIPT) for r in starts for s in starts[r])
    assert "the script starts forked from the start server" not in run.stdout
    assert "job failed: the script failed on every worker:" in run.stderr
    assert "exit code 3" in run.stderr and "failing on purpose at 0:1" in run.stderr


def test_an_exception_recorded_by_record_is_in_the_jobs_message(tmp_path: Path) -> None:
    """The script's ``main`` is decorated with torch's ``@record``, which writes its uncaught
    exception to ``TORCHELASTIC_ERROR_FILE``: the job's message carries that traceback."""
    run = run_restart_job(tmp_path, TWO_HOSTS, "--fail-at", "0:1:all:raise")
    assert run.returncode == 1, run.explain()
    assert "job failed: the script failed on every worker:" in run.stderr
    message = run.stderr[run.stderr.index("job failed:") :]
    assert "Traceback (most recent call last):" in message
    assert "ValueError: rank 1 raised on purpose at 0:1" in message or (
        "ValueError: rank 0 raised on purpose at 0:1" in message
    )
    error_files = {s["env"]["TORCHELASTIC_ERROR_FILE"] for s in run.of("start")}
    assert len(error_files) == 2, "a file of each slot's own"


def test_a_script_that_keeps_failing_spends_the_restart_budget(tmp_path: Path) -> None:
    run = run_restart_job(
        tmp_path, [*TWO_HOSTS, "--max-restarts", "2"], "--fail-at", "0:1:1:sigkill-always"
    )
    assert run.returncode == 1, run.explain()
    assert "restart limit 2 exceeded: the script failed on 127.0.1.2[0] killed by SIGKILL" in (
        run.stderr
    )
    starts = starts_by_rank(run)
    assert [len(starts[r]) for r in (0, 1)] == [3, 3], "the first start and 2 restarts"
    assert [s["env"]["TORCHELASTIC_MAX_RESTARTS"] for s in starts[0]] == ["2"] * 3
