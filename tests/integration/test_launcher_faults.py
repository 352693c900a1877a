"""``elasticjob-run`` fails fast and leaves nothing behind: a broken discovery script fails
the job at once with the script's error, and no worker outlives a launcher killed with
SIGKILL (real processes: the launcher, its rendezvous service and torch workers)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devcluster.procs import alive
from tests.support.job_runs import WORKERS, run_to_end
from tests.support.start_servers import launcher_env

pytestmark = pytest.mark.integration

IDLE_WORKER = WORKERS / "idle_worker.py"
LAUNCHER = [sys.executable, "-m", "elasticjob.launcher.run_command"]
FAST_S = 60.0
"""Every failure here is immediate; a launcher still running after this is a failure."""
WORKERS_UP_S = 120.0
"""How long the workers of a job may take to start and join (torch imports, loaded CPUs)."""


def write_script(path: Path, body: str, mode: int = 0o755) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(mode)
    return path


@pytest.mark.parametrize(
    ("make_script", "message"),
    [
        pytest.param(
            lambda tmp: tmp / "absent.sh",
            "cannot be run: No such file or directory",
            id="missing",
        ),
        pytest.param(
            lambda tmp: write_script(tmp / "plain.sh", "echo 127.0.1.1\n", mode=0o644),
            "cannot be run: Permission denied",
            id="not-executable",
        ),
        pytest.param(
            lambda tmp: write_script(tmp / "garbage.sh", "echo 'this is not a host list'\n"),
            "line 1 'this is not a host list': invalid hostname",
            id="garbage",
        ),
        pytest.param(
            lambda tmp: write_script(
                tmp / "failing.sh", "echo 'cannot reach the cluster API' >&2\nexit 3\n"
            ),
            "exited with status 3; stderr: cannot reach the cluster API",
            id="non-zero-exit",
        ),
    ],
)
def test_a_discovery_script_that_fails_its_first_run_fails_the_job_at_once(
    tmp_path: Path, make_script: Callable[[Path], Path], message: str
) -> None:
    script = make_script(tmp_path)
    started = time.monotonic()
    returncode, _, stderr = run_to_end(
        [*LAUNCHER, "-np", "1", "--host-discovery-script", str(script), "true"],
        tmp_path,
        None,
        FAST_S,
    )
    assert returncode == 1, stderr
    assert f"job failed: host discovery failed: discovery script {str(script)!r}" in stderr
    assert message in stderr, stderr
    assert time.monotonic() - started < FAST_S / 2, "not at once"


def test_later_discovery_failures_are_retried_and_the_last_is_in_the_final_message(
    tmp_path: Path,
) -> None:
    runs = tmp_path / "runs"
    script = write_script(
        tmp_path / "discover.sh",
        f"echo run >> {runs}\n"
        f'if [ "$(wc -l < {runs})" -gt 1 ]; then echo "cluster API down" >&2; exit 5; fi\n'
        "echo 127.0.1.1:1\n",
    )
    returncode, _, stderr = run_to_end(
        [
            *LAUNCHER,
            "-np",
            "2",
            "--min-np",
            "2",
            "--elastic-timeout",
            "3",
            "--host-discovery-script",
            str(script),
            "true",
        ],
        tmp_path,
        None,
        FAST_S,
    )
    assert returncode == 1, stderr
    assert "job failed: elastic timeout: 1 slots available on 1 hosts" in stderr, stderr
    assert (
        f"the last host discovery failed: discovery script {str(script)!r} exited with "
        "status 5; stderr: cluster API down"
    ) in stderr
    assert len(runs.read_text().splitlines()) >= 3, "later failures were not retried"


@pytest.mark.parametrize(
    ("command", "says"),
    [
        pytest.param(
            ["true"],
            "exited with status 0 before it joined the job",
            id="exits-0",
        ),
        pytest.param(
            [sys.executable, str(WORKERS / "torchrun_worker.py")],
            "exited with status 1 before it joined the job",
            id="torchrun-script",
        ),
    ],
)
def test_a_command_that_never_joins_the_job_fails_it_and_points_at_the_recipe(
    tmp_path: Path, command: list[str], says: str
) -> None:
    """A worker command that does not use the worker runtime is not started over and over
    (an exit 0 used to be, forever): the job fails, naming the torchrun recipe."""
    returncode, _, stderr = run_to_end(
        [*LAUNCHER, "-np", "2", "-H", "127.0.1.1:2", *command], tmp_path, None, WORKERS_UP_S
    )
    assert returncode == 1, stderr
    # Either slot may be the first to end.
    assert re.search(rf"127\.0\.1\.1\[[01]\]:? {says}", stderr), stderr
    assert "torchrun / DDP recipe in docs/worker-runtime.md" in stderr, stderr
    assert "runs unchanged in restart mode (elasticjob-run --mode restart" in stderr, stderr


def _wait_for(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return bool(predicate())


@contextlib.contextmanager
def launched(
    tmp_path: Path, worker: list[str], np: int
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A launcher running ``np`` idle workers; yields it once every worker has a rank, and
    kills whatever is left at the end."""
    out = tmp_path / "pids"
    out.mkdir()
    log = (tmp_path / "launcher.log").open("wb")
    launcher = subprocess.Popen(
        [*LAUNCHER, "-np", str(np), *worker, str(out)],
        env=launcher_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        up = _wait_for(
            lambda: len([p for p in out.iterdir() if p.suffix == ""]) >= np, WORKERS_UP_S
        )
        assert up, (tmp_path / "launcher.log").read_text()[-4000:]
        yield launcher, out
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
        log.close()
        for path in out.iterdir():
            if path.suffix == "":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(path.name), signal.SIGKILL)


def _worker_pids(out: Path) -> list[int]:
    return [int(p.name) for p in out.iterdir() if p.suffix == ""]


def test_workers_die_with_a_launcher_killed_by_sigkill(tmp_path: Path) -> None:
    """The kernel kills them (PR_SET_PDEATHSIG) the moment the launcher dies."""
    with launched(tmp_path, [sys.executable, str(IDLE_WORKER)], np=2) as (launcher, out):
        pids = _worker_pids(out)
        assert all(alive(pid) for pid in pids)
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
        gone = _wait_for(lambda: not any(alive(pid) for pid in pids), 10.0)
        assert gone, f"workers {[p for p in pids if alive(p)]} outlived the launcher"


def test_workers_the_kernel_does_not_cover_exit_once_the_rendezvous_is_gone(
    tmp_path: Path,
) -> None:
    """The worker command is a shell that runs the worker as its child: the kernel kills
    the shell with the launcher, and the worker, orphaned, exits on its own after the
    launcher's orphan timeout (10 s)."""
    worker = ["sh", "-c", f'"{sys.executable}" "{IDLE_WORKER}" "$0"; exit 1']
    with launched(tmp_path, worker, np=2) as (launcher, out):
        pids = _worker_pids(out)
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait()
        killed = time.monotonic()
        gone = _wait_for(lambda: not any(alive(pid) for pid in pids), 60.0)
        assert gone, f"orphaned workers {[p for p in pids if alive(p)]} kept running"
        assert time.monotonic() - killed >= 5.0, "they should have lived until the timeout"
