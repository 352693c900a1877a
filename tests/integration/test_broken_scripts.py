"""A broken script ends its job instead of forming round after round, under the launcher
(``workers/broken_worker.py``, real processes over Gloo on loopback): a script that raises on
every rank ends it at once; a crash now and then, with commits between, is recovered from as
before. Rounds that fail in a row with no new commit between them end the job at
``--max-failed-rounds-without-commit``, its last lines giving the exception: the rule's table
in ``tests/unit/driver/test_decisions.py``, a job through it under the operator (which shares
the launcher's driver) in ``tests/e2e/test_lifecycle.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.job_runs import WORKERS, JobRun, loopback_hosts, run_job

pytestmark = pytest.mark.integration

BROKEN_WORKER = WORKERS / "broken_worker.py"
DEADLINE_S = 90.0
"""A broken script's job must end well within this (the rounds themselves take seconds)."""


def run_broken(
    tmp_path: Path, *worker_args: str, limit: int | None = None, cooldown_s: int = 10
) -> JobRun:
    """Three hosts of one slot, a failed host blacklisted for ``cooldown_s``."""
    launcher = ["-np", "3", "--min-np", "2", "-H", loopback_hosts(3)]
    launcher += ["--blacklist-cooldown-range", str(cooldown_s), str(cooldown_s)]
    if limit is not None:
        launcher += ["--max-failed-rounds-without-commit", str(limit)]
    return run_job(
        tmp_path,
        launcher_args=launcher,
        worker_args=worker_args,
        script=BROKEN_WORKER,
        timeout_s=DEADLINE_S,
    )


def rounds(run: JobRun) -> set[int]:
    return {e["round"] for e in run.of("start")}


def test_a_script_that_raises_on_every_rank_ends_in_its_first_round(tmp_path: Path) -> None:
    run = run_broken(tmp_path, "--raise-on", "every-rank", "--at-step", "3")
    assert run.returncode != 0, run.explain()
    assert rounds(run) == {1}, run.explain()
    output = run.stdout + run.stderr
    assert "the script failed on every worker" in output, run.explain()
    assert "ValueError: broken on purpose at step 3 on rank" in output, run.explain()


def test_crashes_with_commits_between_them_are_recovered_from(tmp_path: Path) -> None:
    """Four crashes of rank 0, each after new commits: more failed rounds than the limit, but
    never two in a row without progress."""
    crashes = [arg for step in (2, 4, 6, 8) for arg in ("--once-at", str(step))]
    run = run_broken(tmp_path, "--raise-on", "rank-0", *crashes, limit=2, cooldown_s=1)
    assert run.returncode == 0, run.explain()
    assert len(rounds(run)) >= 5, run.explain()  # hosts back from the blacklist add rounds
    assert max(e["step"] for e in run.of("step")) == 12
