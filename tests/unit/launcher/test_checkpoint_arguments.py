"""``elasticjob-run``'s durable checkpoint flags: what the workers are told, that the driver's
fallback is on with them and off without, and the usage errors (a row each)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from elasticjob.launcher.arguments import build_parser, checkpoint_policy, parse_arguments
from elasticjob.launcher.job_settings import driver_settings
from elasticjob.launcher.processes import WorkerEnvironment
from elasticjob.rendezvous.job_credentials import JobKey
from elasticjob.wire.messages import WorkerId
from elasticjob.worker_contract import (
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_EVERY_COMMITS,
    ENV_CHECKPOINT_INTERVAL,
    ENV_CHECKPOINT_KEEP,
    WorkerSettings,
    checkpoint_env,
)
from tests.support.rendezvous_jobs import slot_of

DIR = ("--checkpoint-dir", "{tmp}")


def parse(*argv: str) -> argparse.Namespace:
    return parse_arguments(build_parser(), ["-np", "2", *argv, "true"])


def test_checkpoint_flags_reach_every_worker_and_turn_the_fallback_on(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    args = parse("--checkpoint-dir", str(folder), "--checkpoint-every-commits", "10")
    policy = checkpoint_policy(args)
    assert policy is not None and policy.folder == str(folder.resolve())
    _, settings, _ = driver_settings(args)
    assert settings.checkpoint_fallback
    settings = WorkerSettings(rendezvous_url="http://127.0.0.1:1", job="job", checkpoint=policy)
    env = WorkerEnvironment(settings, JobKey("the-key")).for_worker(
        WorkerId("localhost", 1), "127.0.0.1", slot_of(WorkerId("localhost", 1))
    )
    assert env[ENV_CHECKPOINT_DIR] == str(folder.resolve())
    assert env[ENV_CHECKPOINT_EVERY_COMMITS] == "10"
    assert env[ENV_CHECKPOINT_INTERVAL] == "0"
    assert env[ENV_CHECKPOINT_KEEP] == "3"


def test_an_interval_and_keep(tmp_path: Path) -> None:
    args = parse(
        "--checkpoint-dir", str(tmp_path), "--checkpoint-interval", "30", "--checkpoint-keep", "5"
    )
    policy = checkpoint_policy(args)
    assert policy is not None
    assert checkpoint_env(policy)[ENV_CHECKPOINT_INTERVAL] == "30"
    assert checkpoint_env(policy)[ENV_CHECKPOINT_EVERY_COMMITS] == "0"
    assert checkpoint_env(policy)[ENV_CHECKPOINT_KEEP] == "5"


def test_without_checkpoints_nothing_is_told_and_the_fallback_is_off() -> None:
    args = parse()
    assert checkpoint_policy(args) is None
    assert not driver_settings(args)[1].checkpoint_fallback
    settings = WorkerSettings(rendezvous_url="http://127.0.0.1:1", job="job")
    env = WorkerEnvironment(settings, JobKey("the-key")).for_worker(
        WorkerId("localhost", 0), "127.0.0.1", slot_of(WorkerId("localhost", 0))
    )
    assert not {k for k in env if k.startswith("ELASTICJOB_CHECKPOINT")}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--checkpoint-every-commits", "5"], "need --checkpoint-dir"),
        (["--checkpoint-interval", "5"], "need --checkpoint-dir"),
        (["--checkpoint-dir", "{tmp}"], "needs exactly one of --checkpoint-every-commits N"),
        (
            [*DIR, "--checkpoint-every-commits", "2", "--checkpoint-interval", "5"],
            "needs exactly one of",
        ),
        (
            ["--checkpoint-dir", "{tmp}", "--checkpoint-every-commits", "0"],
            "--checkpoint-every-commits must be >= 1, got 0",
        ),
        (
            ["--checkpoint-dir", "{tmp}", "--checkpoint-interval", "nan"],
            "--checkpoint-interval must be > 0 seconds",
        ),
        (
            ["--checkpoint-dir", "{tmp}", "--checkpoint-interval", "0"],
            "--checkpoint-interval must be > 0 seconds",
        ),
        (
            [*DIR, "--checkpoint-interval", "1", "--checkpoint-keep", "0"],
            "--checkpoint-keep must be >= 1, got 0",
        ),
        (
            ["--checkpoint-dir", "{tmp}/file", "--checkpoint-interval", "1"],
            "is not a folder",
        ),
        (
            ["--checkpoint-dir", "{tmp}", "--checkpoint-every-commits", "x"],
            "invalid int value: 'x'",
        ),
    ],
)
def test_a_bad_checkpoint_argument_is_a_usage_error(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(SystemExit) as exited:
        parse(*(arg.replace("{tmp}", str(tmp_path)) for arg in argv))
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
