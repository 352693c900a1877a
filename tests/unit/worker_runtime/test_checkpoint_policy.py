"""The checkpoint policy: its checks, the variables both sides read and write, and when a
commit is written (a row each)."""

from __future__ import annotations

import pytest

from elasticjob.checkpoint_policy import (
    DEFAULT_KEEP,
    CheckpointPolicy,
    checkpoint_due,
)
from elasticjob.worker_contract import (
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_EVERY_COMMITS,
    ENV_CHECKPOINT_INTERVAL,
    ENV_CHECKPOINT_KEEP,
    checkpoint_env,
    checkpoint_from_env,
)

FOLDER = "ckpts"
EVERY_10 = CheckpointPolicy(FOLDER, every_commits=10)
EVERY_30_S = CheckpointPolicy(FOLDER, interval_s=30.0)
BOTH = CheckpointPolicy(FOLDER, every_commits=10, interval_s=30.0)


@pytest.mark.parametrize(
    ("policy", "commits", "seconds", "busy", "due"),
    [
        (CheckpointPolicy(FOLDER), 100, 1e6, False, False),  # only explicit checkpoint()
        (EVERY_10, 9, 1e6, False, False),
        (EVERY_10, 10, 0.0, False, True),
        (EVERY_10, 11, 0.0, False, True),  # the writer was busy at the 10th
        (EVERY_10, 10, 0.0, True, False),  # busy: skip this commit rather than block
        (EVERY_30_S, 1, 29.9, False, False),
        (EVERY_30_S, 1, 30.0, False, True),
        (EVERY_30_S, 1, 31.0, True, False),
        (BOTH, 10, 1.0, False, True),
        (BOTH, 2, 30.0, False, True),
        (BOTH, 9, 29.0, False, False),
    ],
)
def test_checkpoint_due(
    policy: CheckpointPolicy, commits: int, seconds: float, busy: bool, due: bool
) -> None:
    assert checkpoint_due(policy, commits, seconds, busy) is due


def test_policy_from_env() -> None:
    policy = checkpoint_from_env(
        {
            ENV_CHECKPOINT_DIR: "/data/ckpt",
            ENV_CHECKPOINT_EVERY_COMMITS: "10",
            ENV_CHECKPOINT_INTERVAL: "2.5",
            ENV_CHECKPOINT_KEEP: "2",
        }
    )
    assert policy == CheckpointPolicy("/data/ckpt", 10, 2.5, 2)
    assert checkpoint_from_env({ENV_CHECKPOINT_DIR: "/c"}) == CheckpointPolicy(
        "/c", 0, 0.0, DEFAULT_KEEP
    )
    assert checkpoint_from_env({}) is None
    assert checkpoint_from_env({ENV_CHECKPOINT_DIR: ""}) is None


@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        (ENV_CHECKPOINT_EVERY_COMMITS, "ten", "whole number"),
        (ENV_CHECKPOINT_EVERY_COMMITS, "-1", ">= 0"),
        (ENV_CHECKPOINT_KEEP, "0", ">= 1"),
        (ENV_CHECKPOINT_INTERVAL, "-3", "seconds"),
    ],
)
def test_malformed_policy_names_the_variable(name: str, raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=f"{name}.*{message}"):
        checkpoint_from_env({ENV_CHECKPOINT_DIR: "/c", name: raw})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"folder": ""}, "must not be empty"),
        ({"every_commits": -1}, "must be >= 0"),
        ({"interval_s": float("inf")}, "must be >= 0"),
        ({"every_commits": 1, "keep": 0}, "at least 1 checkpoint must be kept"),
    ],
)
def test_a_bad_policy_is_refused(changes: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"folder": "/ckpt"} | changes
    with pytest.raises(ValueError, match=message):
        CheckpointPolicy(**fields)  # type: ignore[arg-type]


def test_worker_env_round_trips() -> None:
    policy = CheckpointPolicy("/ckpt", interval_s=2.5, keep=4)
    env = checkpoint_env(policy)
    assert env == {
        ENV_CHECKPOINT_DIR: "/ckpt",
        ENV_CHECKPOINT_EVERY_COMMITS: "0",
        ENV_CHECKPOINT_INTERVAL: "2.5",
        ENV_CHECKPOINT_KEEP: "4",
    }
    assert checkpoint_from_env(env) == policy
