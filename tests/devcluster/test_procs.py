"""Which processes are a cluster's: those marked with its run directory, never the shell
(or any process) a command runs under, even when it exported the marker to choose the run
directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from devcluster.config import MARKER_ENV

REPO = Path(__file__).resolve().parents[2]
LIST_MARKED = (
    "import json, sys; from pathlib import Path; from devcluster import procs; "
    "print(json.dumps(procs.marked_pids(Path(sys.argv[1]))))"
)


def test_a_shell_that_exported_the_marker_is_not_the_clusters(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = {**os.environ, MARKER_ENV: str(run_dir), "PYTHONPATH": str(REPO)}
    marked = subprocess.Popen(["sleep", "60"], env=env)  # a process the cluster started
    try:
        # bash -c 'python ...; true' keeps bash alive above python: a marked ancestor.
        shell = subprocess.run(
            ["bash", "-c", f'"{sys.executable}" -c "{LIST_MARKED}" "{run_dir}"; true'],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert json.loads(shell.stdout) == [marked.pid]
    finally:
        marked.kill()
        marked.wait(timeout=10)
