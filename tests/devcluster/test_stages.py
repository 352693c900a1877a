"""The quiet stages of a first run (``devcluster/stages.py``): a line per stage on the
terminal, the tools' output in the stage's log, its tail and path when it fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from devcluster.stages import TAIL_LINES, StageFailed, main, run_stage, stage

NOISY = "for i in $(seq 1 100); do echo tool line $i; done"


def test_a_stage_shows_one_line_and_its_time_and_logs_the_tools_output(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "logs" / "build.log"
    run_stage("building things", log, ["sh", "-c", NOISY])
    out, err = capfd.readouterr()
    assert out.splitlines()[0] == f"==> building things (log: {log})"
    assert out.splitlines()[-1].startswith("    done in ")
    assert "tool line" not in out + err
    assert log.read_text().splitlines() == [f"tool line {i}" for i in range(1, 101)]


def test_a_failed_stage_prints_the_tail_of_its_log_and_its_path(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "build.log"
    with pytest.raises(StageFailed):
        run_stage("building things", log, ["sh", "-c", f"{NOISY}; exit 3"])
    out, _ = capfd.readouterr()
    assert "FAILED after" in out and "exit status 3" in out
    shown = [line for line in out.splitlines() if line.startswith("    | ")]
    assert shown == [f"    | tool line {i}" for i in range(101 - TAIL_LINES, 101)]
    assert out.splitlines()[-1] == f"    (the whole log: {log})"
    assert len(log.read_text().splitlines()) == 100, "nothing of the output is lost"


def test_a_long_stage_says_how_long_it_has_run_and_how_much_it_logged(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "slow.log"
    run_stage("a slow stage", log, ["sh", "-c", "echo one; sleep 0.5; echo two"], every_s=0.1)
    out, _ = capfd.readouterr()
    progress = [line for line in out.splitlines() if line.startswith("    ... ")]
    assert progress, out
    assert all(" so far, " in line and " lines logged" in line for line in progress)


def test_python_code_as_a_stage_sends_its_output_and_its_subprocesses_to_the_log(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "cluster.log"
    with stage("starting a cluster", log):
        print("from python")
        print("from python's stderr", file=sys.stderr)
        subprocess.run(["echo", "from a subprocess"], check=True)
    print("after the stage")
    out, err = capfd.readouterr()
    assert out.splitlines()[0] == f"==> starting a cluster (log: {log})"
    assert out.splitlines()[1].startswith("    done in ")
    assert out.splitlines()[-1] == "after the stage", "the terminal is back after the stage"
    assert "from" not in out + err
    assert log.read_text().splitlines() == [
        "from python",
        "from python's stderr",
        "from a subprocess",
    ]


def test_python_code_that_fails_as_a_stage_shows_the_tail_and_raises(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "cluster.log"
    with pytest.raises(RuntimeError, match="no nodes"), stage("starting a cluster", log):
        print("node 1 did not register")
        raise RuntimeError("no nodes")
    out, _ = capfd.readouterr()
    assert "FAILED after" in out and "RuntimeError: no nodes" in out
    assert "    | node 1 did not register" in out


def test_the_command_line_runs_a_stage_and_refuses_a_missing_command(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    assert main(["a stage", str(tmp_path / "a.log"), "--", "true"]) == 0
    assert main(["a stage", str(tmp_path / "a.log"), "--", "false"]) == 1
    assert main(["a stage", str(tmp_path / "a.log")]) == 2
    assert "usage: python3 -m devcluster.stages" in capfd.readouterr().err
