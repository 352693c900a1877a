"""Runs ``elasticjob-run`` with the test training script (``elastic_worker.py``) and reads back
what happened: the workers' events, and whether every sample was trained exactly once."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.start_servers import launcher_env

WORKERS = Path(__file__).resolve().parents[1] / "integration" / "workers"
"""The integration tests' worker scripts."""
WORKER = WORKERS / "elastic_worker.py"
DISCOVERY = WORKERS / "schedule_discovery.py"


@dataclass
class JobRun:
    returncode: int
    stdout: str
    stderr: str
    events: list[dict[str, Any]] = field(default_factory=list)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["ev"] == kind]

    def explain(self) -> str:
        return (
            f"exit {self.returncode}\n--- stderr ---\n{self.stderr[-6000:]}\n"
            f"--- stdout ---\n{self.stdout[-3000:]}"
        )

    def epoch_ends(self) -> dict[int, list[dict[str, Any]]]:
        """The epoch_end events of the committed trajectory, per epoch (the last round that
        ended each epoch)."""
        ends: dict[int, list[dict[str, Any]]] = {}
        for event in self.of("epoch_end"):
            ends.setdefault(event["epoch"], []).append(event)
        return {
            epoch: [e for e in events if e["round"] == max(x["round"] for x in events)]
            for epoch, events in ends.items()
        }


def loopback_hosts(count: int) -> str:
    """``count`` loopback hosts of one slot each, for ``-H``."""
    return ",".join(f"127.0.1.{i}:1" for i in range(1, count + 1))


def write_discovery(tmp_path: Path, schedule: dict[int, str]) -> tuple[Path, Path]:
    """A discovery script following ``schedule`` (epoch -> hosts) and its epoch file."""
    schedule_file = tmp_path / "schedule.json"
    schedule_file.write_text(json.dumps({str(k): v for k, v in schedule.items()}))
    epoch_file = tmp_path / "epoch"
    script = tmp_path / "discover.sh"
    script.write_text(
        f"#!/bin/sh\nexec {sys.executable} {DISCOVERY} {schedule_file} {epoch_file}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script, epoch_file


def run_job(
    tmp_path: Path,
    *,
    launcher_args: Sequence[str],
    worker_args: Sequence[str] = (),
    schedule: dict[int, str] | None = None,
    timeout_s: float = 240.0,
    launcher_prefix: Sequence[str] = (),
    worker_prefix: Sequence[str] = (),
    script: Path = WORKER,
) -> JobRun:
    """Run a job of ``script`` to its end (or kill it at ``timeout_s``) and collect the
    workers' events. The prefixes are commands that exec the launcher and each worker (a
    network namespace, a cgroup)."""
    log_dir = tmp_path / "events"
    args = [
        *launcher_prefix,
        sys.executable,
        "-m",
        "elasticjob.launcher.run_command",
        *launcher_args,
    ]
    worker = [*worker_prefix, sys.executable, str(script), "--log-dir", str(log_dir), *worker_args]
    if schedule is not None:
        script, epoch_file = write_discovery(tmp_path, schedule)
        args += ["--host-discovery-script", str(script)]
        worker += ["--epoch-file", str(epoch_file)]
    returncode, stdout, stderr = run_to_end([*args, *worker], tmp_path, None, timeout_s)
    run = JobRun(returncode, stdout, stderr, read_events(log_dir))
    kill_leftovers(run)
    return run


def run_to_end(
    command: Sequence[str], cwd: Path, env: dict[str, str] | None, timeout_s: float
) -> tuple[int, str, str]:
    """Run a launcher to its end (in ``env``, this process's by default, less what the test
    process gained as it ran: ``start_servers.launcher_env``); at ``timeout_s`` stop it
    (SIGTERM: it stops its workers), then kill it. Returns the exit status, stdout and
    stderr."""
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=launcher_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            stdout, stderr = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
        stderr += f"\n[harness] stopped after {timeout_s} s"
    return process.returncode, stdout, stderr


def read_events(log_dir: Path) -> list[dict[str, Any]]:
    """The workers' events so far, in time order. Each is a line ended by its newline: a last
    line without one is still being written (a test polls while the workers run) and is left
    for the next read."""
    events: list[dict[str, Any]] = []
    for path in sorted(log_dir.glob("*.jsonl")) if log_dir.exists() else []:
        *complete, _being_written = path.read_text().split("\n")
        events.extend(json.loads(line) for line in complete if line)
    return sorted(events, key=lambda e: e["time"])


def kill_leftovers(run: JobRun) -> list[int]:
    """SIGKILL any worker still alive after the launcher ended; returns their pids."""
    alive = []
    for pid in {e["pid"] for e in run.events}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            alive.append(pid)
    return alive


EPOCHS = 3
"""Epochs of a job of the training script, unless a test gives its own."""
SAMPLES = 96


def worker_args(*extra: str, epochs: int = EPOCHS) -> list[str]:
    return ["--epochs", str(epochs), "--samples", str(SAMPLES), *extra]


def assert_trained_exactly_once(run: JobRun, epochs: int = EPOCHS) -> list[dict[str, Any]]:
    """Every survivor ends with the same weights and every sample trained once per epoch."""
    done = run.of("done")
    assert done, run.explain()
    assert len({d["digest"] for d in done}) == 1, f"ranks disagree: {done}"
    for d in done:
        assert (d["seen_min"], d["seen_max"]) == (epochs, epochs), d
    final = max(d["round"] for d in done)
    assert {d["round"] for d in done} == {final}
    assert sorted(d["rank"] for d in done) == list(range(done[0]["size"]))
    return done


def ranks_by_host(events: list[dict[str, Any]]) -> dict[tuple[str, int], int]:
    return {(e["host"], e["slot"]): e["rank"] for e in events}


HEARTBEAT_TIMEOUT_S = 5.0
"""The launcher's default bound on a worker's silence."""
