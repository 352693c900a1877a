"""``python -m elasticjob.worker_runtime.slots``: one process per slot of a pod."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from elasticjob import wire

SLOTS = [sys.executable, "-m", "elasticjob.worker_runtime.slots"]


def test_every_slot_runs_with_its_local_rank(tmp_path: Path) -> None:
    script = f"import os; open(r'{tmp_path}/' + os.environ['{wire.ENV_LOCAL_RANK}'], 'w').close()"
    done = subprocess.run(
        [*SLOTS, "3", "--", sys.executable, "-c", script], timeout=120, check=False
    )
    assert done.returncode == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0", "1", "2"]


def test_the_first_failing_slot_takes_the_others_down() -> None:
    script = (
        "import os, time\n"
        f"if os.environ['{wire.ENV_LOCAL_RANK}'] == '1': raise SystemExit(3)\n"
        "time.sleep(600)\n"
    )
    started = time.monotonic()
    done = subprocess.run(
        [*SLOTS, "2", "--", sys.executable, "-c", script], timeout=120, check=False
    )
    assert done.returncode == 3
    assert time.monotonic() - started < 60, "the sleeping slot was not stopped"


def test_usage_errors_are_refused() -> None:
    done = subprocess.run(
        [*SLOTS, "two", "--", "true"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2 and "usage" in done.stderr
