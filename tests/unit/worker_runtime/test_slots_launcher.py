"""``python -m elasticjob.worker_runtime.slots``: one process per slot of a pod."""

from __future__ import annotations

import os
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


def test_every_slot_gets_horovods_and_torchruns_launch_variables(tmp_path: Path) -> None:
    names = [wire.ENV_HOROVOD_HOSTNAME, wire.ENV_HOROVOD_LOCAL_RANK, wire.ENV_TORCH_LOCAL_RANK]
    script = (
        "import os\n"
        f"slot = os.environ['{wire.ENV_LOCAL_RANK}']\n"
        f"values = [os.environ[n] for n in {names!r}]\n"
        f"open(r'{tmp_path}/' + slot, 'w').write(' '.join(values))\n"
    )
    env = {**os.environ, wire.ENV_HOSTNAME: "pod-a"}
    done = subprocess.run(
        [*SLOTS, "2", "--", sys.executable, "-c", script], env=env, timeout=120, check=False
    )
    assert done.returncode == 0
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == {
        "0": "pod-a 0 0",
        "1": "pod-a 1 1",
    }


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
