"""``elasticjob-run`` refuses bad arguments with a usage error (exit status 2, the usage and
the problem on stderr), never with a traceback or a long wait, and names a worker command
that cannot run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from elasticjob.driver.driver_types import DEFAULT_MAX_RESTARTS
from elasticjob.launcher.arguments import build_parser, parse_arguments
from elasticjob.launcher.job_settings import driver_settings
from elasticjob.launcher.run_command import main
from elasticjob.launcher.warm_workers import START_SERVER_ENV

CLI_TIMEOUT_S = 60.0
"""Every case ends at once; a launcher still running after this is a failure."""


def usage_error(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What ``elasticjob-run args`` writes to stderr, run in this process: it must end with
    exit status 2 (a usage error) before it starts anything."""
    try:
        status = main(args)
    except SystemExit as exited:
        status = exited.code  # type: ignore[assignment]
    assert status == 2, capsys.readouterr().err
    return capsys.readouterr().err


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "elasticjob.launcher.run_command", *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        cwd=cwd,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--slots", "0", "true"], "--slots must be from 1 to 1024, got 0"),
        (["--slots", "5000", "true"], "--slots must be from 1 to 1024, got 5000"),
        (["--job-name", "Bad_Name", "true"], "--job-name 'Bad_Name' is not a valid job name"),
        (["--job-name", "", "true"], "--job-name '' is not a valid job name"),
        (["-np", "0", "true"], "-np must be >= 1, got 0"),
        (["--min-np", "-1", "true"], "--min-np must be >= 1, got -1"),
        (["--max-np", "0", "true"], "--max-np must be >= 1, got 0"),
        (["--min-np", "3", "--max-np", "2", "true"], "--min-np (3) must not exceed --max-np (2)"),
        (
            ["-np", "5", "--max-np", "3", "--host-discovery-script", "./hosts.sh", "true"],
            "-np (the default --min-np) (5) must not exceed --max-np (3)",
        ),
        (["--reset-limit", "-1", "true"], "--reset-limit must be >= 0, got -1"),
        (["--max-restarts", "-1", "true"], "--max-restarts must be >= 0, got -1"),
        (["--mode", "torchrun", "true"], "argument --mode: invalid choice: 'torchrun'"),
        (["--elastic-timeout", "-5", "true"], "--elastic-timeout must be >= 0 seconds"),
        (["--elastic-timeout", "nan", "true"], "--elastic-timeout must be >= 0 seconds"),
        (["--start-timeout", "0", "true"], "--start-timeout must be > 0 seconds"),
        (["--start-timeout", "inf", "true"], "--start-timeout must be > 0 seconds"),
        (["--removal-grace", "0", "true"], "--removal-grace must be > 0 seconds"),
        (["--heartbeat-timeout", "-1", "true"], "--heartbeat-timeout must be >= 0 seconds"),
        (
            ["--blacklist-cooldown-range", "0", "10", "true"],
            "--blacklist-cooldown-range must be 0 < MIN <= MAX seconds, got 0 10",
        ),
        (
            ["--blacklist-cooldown-range", "10", "1", "true"],
            "--blacklist-cooldown-range must be 0 < MIN <= MAX seconds, got 10 1",
        ),
        (["-np", "1", "-H", "a:1,,b", "true"], "-H: host list 'a:1,,b': entry 2 is empty"),
        (["-np", "1", "-H", "a:0", "true"], "-H: host list 'a:0': entry 1 'a:0': slots must be"),
        (["-np", "2"], "no worker command given"),
        (["-np", "2", "--"], "no worker command given"),
        (["--num-proc", "two", "true"], "argument -np/--num-proc: invalid int value: 'two'"),
        (
            ["--serve-starts", "starts.sock", "python", "train.py"],
            "--serve-starts takes an interpreter as its command, nothing more",
        ),
    ],
)
def test_a_bad_argument_is_a_usage_error(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = usage_error(args, capsys)
    assert "usage: elasticjob-run" in err
    assert f"elasticjob-run: error: {message}" in err


def test_the_command_exits_2_with_its_usage_and_no_traceback() -> None:
    """The command as users run it (a process of its own) for one case of the table above."""
    result = run_cli("--slots", "0", "true")
    assert result.returncode == 2, result.stderr
    assert "usage: elasticjob-run" in result.stderr
    assert "elasticjob-run: error: --slots must be from 1 to 1024, got 0" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-np", "3", "-H", "127.0.0.1:2", "true"], "the fixed hosts offer 2 slots (127.0.0.1:2)"),
        (
            ["-np", "2", "--min-np", "3", "--max-np", "4", "-H", "127.0.0.1:1,localhost:1", "true"],
            "the fixed hosts offer 2 slots (127.0.0.1:1,localhost:1), fewer than the 3 processes",
        ),
        (
            ["-np", "1", "-H", "127.0.0.1", "--slots", "2", "--min-np", "3", "true"],
            "the fixed hosts offer 2 slots (127.0.0.1), fewer than the 3 processes",
        ),
    ],
)
def test_fixed_hosts_that_can_never_reach_min_np_fail_at_once(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not after the elastic timeout (600 s by default): fixed hosts never gain slots."""
    err = usage_error(args, capsys)
    assert f"elasticjob-run: error: {message}" in err
    assert "can never be enough" in err


def test_a_missing_worker_command_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    """Not 'every discovered host is blacklisted' after the first start failed."""
    assert main(["-np", "1", "elasticjob-no-such-command", "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert "worker command 'elasticjob-no-such-command' not found (not on PATH)" in err
    assert "blacklisted" not in err


def test_a_worker_command_path_that_is_missing_or_not_executable_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "train.sh"
    assert main(["-np", "1", str(missing)]) == 2
    assert f"worker command {str(missing)!r} not found" in capsys.readouterr().err
    missing.write_text("#!/bin/sh\nexit 0\n")
    assert main(["-np", "1", str(missing)]) == 2
    assert f"worker command {str(missing)!r} is not executable" in capsys.readouterr().err


def test_a_worker_command_that_fails_to_start_fails_the_job_at_once(tmp_path: Path) -> None:
    """The file is there and executable, but its interpreter is not: the start itself fails,
    and the job fails with that cause at the first start, not by blacklisting hosts."""
    script = tmp_path / "train.sh"
    script.write_text("#!/no/such/interpreter\n")
    script.chmod(0o755)
    result = run_cli("-np", "2", "--elastic-timeout", "600", str(script))
    assert result.returncode == 1, result.stderr
    assert (
        f"job failed: worker command {str(script)!r} cannot be run: No such file or directory"
        in result.stderr
    )
    assert "blacklisted" not in result.stderr


def test_the_commands_own_flags_are_never_taken_for_the_launchers() -> None:
    """``--checkpoint`` would be an ambiguous abbreviation of the checkpoint flags, and
    ``--verbose`` is one of ours: both belong to the command after it."""
    command = ["python", "train.py", "--checkpoint", "ckpt.pt", "--verbose", "--mode", "x"]
    args = parse_arguments(build_parser(), ["-np", "1", *command])
    assert args.command == command and not args.verbose


@pytest.mark.parametrize(
    ("flags", "restart_limit"),
    [
        pytest.param([], None, id="elastic-unlimited"),
        pytest.param(["--mode", "restart"], DEFAULT_MAX_RESTARTS, id="restart-default"),
        pytest.param(["--mode", "restart", "--max-restarts", "0"], 0, id="restart-none-allowed"),
        pytest.param(["--max-restarts", "5"], 5, id="elastic-with-a-limit"),
    ],
)
def test_max_restarts_its_default_and_the_fallback_in_restart_mode(
    flags: list[str], restart_limit: int | None
) -> None:
    args = parse_arguments(build_parser(), ["-np", "1", *flags, "true"])
    settings = driver_settings(args)[1]
    assert settings.restart_limit == restart_limit
    assert settings.checkpoint_fallback is (args.mode == "restart"), (
        "a restart-mode script resumes from its own checkpoint: losing every worker is no end"
    )


def test_the_shared_start_server_defaults_to_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["-np", "1", "-H", "localhost:1", "true"]
    monkeypatch.setenv(START_SERVER_ENV, "/run/starts.sock")
    assert parse_arguments(build_parser(), args).start_server == "/run/starts.sock"
    monkeypatch.delenv(START_SERVER_ENV)
    assert parse_arguments(build_parser(), args).start_server is None
