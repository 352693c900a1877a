"""The checkpoint policy both front ends build: its checks (a row each) and the variables."""

from __future__ import annotations

import pytest

from elasticjob import wire
from elasticjob.driver.checkpoint_policy import CheckpointPolicy


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"directory": ""}, "must not be empty"),
        ({}, "give exactly one"),
        ({"every_commits": 2, "interval_s": 3.0}, "give exactly one"),
        ({"every_commits": -1}, "must be >= 0"),
        ({"interval_s": float("inf")}, "must be >= 0"),
        ({"every_commits": 1, "keep": 0}, "at least 1 checkpoint must be kept"),
    ],
)
def test_a_bad_policy_is_refused(changes: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"directory": "/ckpt"} | changes
    with pytest.raises(ValueError, match=message):
        CheckpointPolicy(**fields)  # type: ignore[arg-type]


def test_worker_env_names_every_contract_variable() -> None:
    env = CheckpointPolicy("/ckpt", interval_s=2.5, keep=4).worker_env()
    assert env == {
        wire.ENV_CHECKPOINT_DIR: "/ckpt",
        wire.ENV_CHECKPOINT_EVERY_COMMITS: "0",
        wire.ENV_CHECKPOINT_INTERVAL: "2.5",
        wire.ENV_CHECKPOINT_KEEP: "4",
    }
