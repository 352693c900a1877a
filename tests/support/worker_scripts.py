"""Runs the worker API's test scripts as launcher jobs on loopback hosts (the worker-API
suite's jobs of 2 and 3 processes, the abort scenarios) or standalone (a world of one), and
reads back the result file each rank writes."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from elasticjob.launcher.warm_workers import START_SERVER_ENV
from elasticjob.worker_contract import ENV_COLLECTIVE_TIMEOUT
from tests.support.job_runs import read_events, run_to_end
from tests.support.start_servers import launcher_env

HOSTS = "127.0.1.1:2,127.0.1.2:1"
RUN_TIMEOUT_S = 180.0
"""Bound on one job; a healthy job takes a few seconds plus the workers' imports."""
COLLECTIVE_TIMEOUT_S = "30"
"""Bound on any collective in the workers, so a desynchronised job fails instead of hanging."""

Result = dict[str, Any]


@dataclass(frozen=True)
class ScriptRun:
    """A script's run to its end and the result file of each rank."""

    command: list[str]
    returncode: int
    stdout: str
    stderr: str
    results: list[Result]

    def explain(self) -> str:
        first_error = self.stdout.find("Traceback")
        traceback = self.stdout[first_error : first_error + 4000] if first_error >= 0 else ""
        return (
            f"command: {' '.join(self.command)}\nexit {self.returncode}, "
            f"{len(self.results)} result files\n--- stderr (tail) ---\n{self.stderr[-4000:]}\n"
            f"--- stdout (first traceback) ---\n{traceback}\n"
            f"--- stdout (tail) ---\n{self.stdout[-4000:]}"
        )


def worker_env() -> dict[str, str]:
    """This environment without any launcher variables (a worker started from it runs
    standalone) but a shared start server's, with a bounded collective timeout."""
    env = {
        k: v
        for k, v in launcher_env().items()
        if not k.startswith("ELASTICJOB_") or k == START_SERVER_ENV
    }
    env[ENV_COLLECTIVE_TIMEOUT] = COLLECTIVE_TIMEOUT_S
    return env


def run(command: list[str], out_dir: Path, timeout_s: float = RUN_TIMEOUT_S) -> ScriptRun:
    """Run ``command`` to its end (stopping it at ``timeout_s``) and read the result files."""
    returncode, stdout, stderr = run_to_end(command, out_dir.parent, worker_env(), timeout_s)
    files = sorted(out_dir.glob("rank-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    results = [json.loads(path.read_text()) for path in files]
    return ScriptRun(command, returncode, stdout, stderr, results)


def launcher(*args: str) -> list[str]:
    return [sys.executable, "-m", "elasticjob.launcher.run_command", *args]


def run_standalone(worker: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Result]:
    """The results of ``worker`` run without a launcher (a world of one); fails the test if
    the run failed."""
    out = tmp_path_factory.mktemp("standalone") / "results"
    job = run([sys.executable, str(worker), "--out", str(out)], out)
    if job.returncode != 0 or len(job.results) != 1:
        pytest.fail(f"the standalone run failed\n{job.explain()}")
    return job.results


def run_on_ranks(
    worker: Path, size: int, tmp_path_factory: pytest.TempPathFactory, *args: str
) -> list[Result]:
    """Every rank's results, in rank order, from ``worker`` (given ``args``) run as one
    launcher job of ``size`` processes (2: on one host; 3: on two, :data:`HOSTS`); fails the
    test if the job failed."""
    out = tmp_path_factory.mktemp(f"{worker.stem}-{size}") / "results"
    hosts = "127.0.1.1:2" if size == 2 else HOSTS
    command = [sys.executable, str(worker), "--out", str(out), *args]
    job = run(launcher("-np", str(size), "-H", hosts, *command), out)
    if job.returncode != 0 or len(job.results) != size:
        pytest.fail(f"the {size}-process job failed\n{job.explain()}")
    return job.results


API_SUITE = Path(__file__).resolve().parents[1] / "integration" / "workers" / "api_suite_worker.py"
"""The worker-API scripts run as one job (``workers/api_suite_worker.py``)."""
API_SUITE_PARTS: dict[int, tuple[str, ...]] = {
    2: ("process_sets", "names", "dtypes", "autograd"),
    3: ("process_sets", "names", "dtypes", "autograd", "api", "collectives", "optimizer"),
}
"""The parts each size's job runs, in order (``<part>_worker.py``'s ``run``)."""
_api_suite_runs: dict[int, list[Result]] = {}


def api_suite_part(part: str, size: int, tmp_path_factory: pytest.TempPathFactory) -> list[Result]:
    """Every rank's results of one part of the worker-API suite (:data:`API_SUITE_PARTS`),
    from the suite's one job of ``size`` processes in this test session (run by the first
    module that asks)."""
    if part not in API_SUITE_PARTS[size]:
        raise ValueError(f"the {size}-process job of the worker-API suite runs no {part!r}")
    if size not in _api_suite_runs:
        parts = ",".join(API_SUITE_PARTS[size])
        _api_suite_runs[size] = run_on_ranks(API_SUITE, size, tmp_path_factory, "--parts", parts)
    return [ranks[part] for ranks in _api_suite_runs[size]]


def run_abort_scenario(
    worker: Path, tmp_path: Path, collective_timeout_s: float
) -> tuple[list[Result], str]:
    """Run ``worker --abort`` as a 3-process job that may shrink to 2 (its rank 2 kills
    itself) under a long collective timeout; fails the test unless it exits 0. Returns every
    rank's events (``<out>/events-<pid>.jsonl``) in time order and an explanation for asserts."""
    out = tmp_path / "results"
    env = worker_env()
    env[ENV_COLLECTIVE_TIMEOUT] = str(collective_timeout_s)
    command = launcher(
        *("-np", "3", "--min-np", "2", "-H", HOSTS),
        *(sys.executable, str(worker), "--out", str(out), "--abort"),
    )
    returncode, stdout, stderr = run_to_end(command, tmp_path, env, RUN_TIMEOUT_S)
    events = read_events(out)
    explain = f"exit {returncode}\n{stderr[-4000:]}\n{stdout[-4000:]}\n{events}"
    assert returncode == 0, explain
    return events, explain


def section(results: list[Result], name: str) -> list[Any]:
    return [r[name] for r in results]


def same_everywhere(values: list[Any]) -> Any:
    assert all(v == values[0] for v in values), f"ranks disagree: {values}"
    return values[0]
