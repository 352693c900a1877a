"""The durable fallback with real processes: a job checkpoints while it trains, every worker
is SIGKILLed at once (no survivor), and a new launcher run on the same checkpoint folder
resumes from the newest checkpoint: the samples trained after it are trained again, none is
skipped (the accounting of ``test_elastic_scenarios``), and every rank ends identical.

The checkpoint variables are set by hand on the launcher (its workers inherit them) without
the driver's fallback, so the first run fails and the second resumes. With the launcher's
checkpoint flags its driver resumes within the same run: ``test_launcher_fallback.py``.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from elasticjob.worker_contract import (
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_EVERY_COMMITS,
    ENV_CHECKPOINT_KEEP,
)
from tests.support.job_runs import JobRun, assert_trained_exactly_once, run_job, worker_args

pytestmark = pytest.mark.integration

KILL_AT = (1, 7)
"""(epoch, batch) at which both workers SIGKILL themselves."""


def launch(tmp_path: Path, folder: Path) -> JobRun:
    env = [
        f"{ENV_CHECKPOINT_DIR}={folder}",
        f"{ENV_CHECKPOINT_EVERY_COMMITS}=2",
        f"{ENV_CHECKPOINT_KEEP}=2",
    ]
    epoch, batch = KILL_AT
    return run_job(
        tmp_path,
        launcher_args=["-np", "2", "-H", "127.0.1.1:2"],
        worker_args=worker_args(
            "--fail", f"{epoch}:{batch}:0:sigkill", "--fail", f"{epoch}:{batch}:1:sigkill"
        ),
        launcher_prefix=["env", *env],
    )


def test_every_worker_killed_resumes_from_the_newest_checkpoint(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    first = launch(tmp_path, folder)
    killed = first.of("fail")
    assert {e["rank"] for e in killed} == {0, 1}, first.explain()
    # Keep 2, one more when the writer was killed between a rename and the pruning (and
    # perhaps a .tmp folder: killed mid-write, never read).
    written = sorted(p.name for p in folder.iterdir() if not p.name.endswith(".tmp"))
    assert 1 <= len(written) <= 3, written

    second_started = time.time()
    second = launch(tmp_path, folder)  # the fired failures do not fire again
    assert second.returncode == 0, second.explain()
    loaded = re.findall(r"loaded checkpoint (ckpt-\S+) \(epoch (\d+), step (\d+)", second.stdout)
    if first.returncode != 0:  # a driver without the fallback: the first run failed
        assert loaded, second.explain()
        name, _epoch, _step = loaded[0]
        assert name in written
    assert_trained_exactly_once(second)
    # The second run starts where a checkpoint left off: neither afresh nor at the kill.
    steps = [e for e in second.of("step") if e["time"] >= second_started]
    resumed_at = (steps[0]["epoch"], steps[0]["batch"])
    assert (0, 0) < resumed_at < KILL_AT, resumed_at
