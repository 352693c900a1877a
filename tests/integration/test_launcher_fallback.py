"""The durable fallback in one launcher run: ``elasticjob-run --checkpoint-dir`` while every
worker is SIGKILLed at once (no survivor). Their host is blacklisted; the driver waits out the
cooldown instead of failing, starts fresh workers, and their rank 0 loads the newest
checkpoint: the samples trained after it are trained again, none is skipped (the accounting
of ``test_elastic_scenarios``), every rank ends identical, and the job record holds the
checkpoints and the restore with the steps lost."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from elasticjob.driver.goodput import LostTo
from elasticjob.driver.job_record import EventKind, JobRecordData
from tests.support.job_runs import assert_trained_exactly_once, run_job, worker_args

pytestmark = pytest.mark.integration

KILL_AT = (1, 7)
"""(epoch, batch) at which both workers SIGKILL themselves."""


def test_every_worker_killed_resumes_from_the_newest_checkpoint_in_the_same_run(
    tmp_path: Path,
) -> None:
    folder, record = tmp_path / "checkpoints", tmp_path / "record.json"
    epoch, batch = KILL_AT
    run = run_job(
        tmp_path,
        launcher_args=[
            "-np", "2", "-H", "127.0.1.1:2",
            "--checkpoint-dir", str(folder), "--checkpoint-every-commits", "2",
            "--checkpoint-keep", "2",
            "--blacklist-cooldown-range", "1", "2",
            "--job-record", str(record),
        ],
        # Steps slow enough that progress reports (one a second at most) carry checkpoints.
        worker_args=worker_args(
            "--step-time", "0.15",
            "--fail", f"{epoch}:{batch}:0:sigkill", "--fail", f"{epoch}:{batch}:1:sigkill",
        ),
    )  # fmt: skip
    assert run.returncode == 0, run.explain()
    killed = run.of("fail")
    assert {e["rank"] for e in killed} == {0, 1}, run.explain()
    assert "no worker of round 1 survives" in run.stderr, run.explain()
    loaded = re.findall(r"loaded checkpoint (ckpt-\S+) \(epoch (\d+), step (\d+)", run.stdout)
    assert len(loaded) == 1, run.explain()
    name = loaded[0][0]
    assert_trained_exactly_once(run)
    # Training resumed where the checkpoint left off: neither afresh nor at the kill.
    killed_at = max(e["time"] for e in killed)
    steps = [e for e in run.of("step") if e["time"] > killed_at]
    assert steps, run.explain()
    assert (0, 0) < (steps[0]["epoch"], steps[0]["batch"]) < KILL_AT, steps[0]
    assert min(e["round"] for e in steps) == 2, "the fresh workers' round"
    fresh = {e["pid"] for e in run.of("done")}
    assert not fresh & {e["pid"] for e in killed}, "no survivor finished the job"

    data = JobRecordData.model_validate(json.loads(record.read_text()))
    kinds = [e.kind for e in data.events]
    assert EventKind.CHECKPOINT in kinds and kinds.count(EventKind.RESTORED) == 1, run.explain()
    restored = next(e for e in data.events if e.kind is EventKind.RESTORED)
    # Counted from the committed step rank 0 last reported (reports go at most every few
    # seconds: in a run this short none may have arrived since the checkpoint's commit, and
    # then the figure is unknown rather than made up), less than two checkpoints apart.
    lost = re.fullmatch(
        rf"{name} at step {loaded[0][2]}: (an unknown number of|\d+) committed steps trained "
        r"again \(no survivor\)",
        restored.message,
    )
    assert lost is not None, restored
    assert not lost[1].isdigit() or int(lost[1]) < 8, restored
    lost = data.state.lost_seconds
    assert lost[LostTo.RECOVERY] > 0 and lost[LostTo.ROLLBACK] > 0, data
