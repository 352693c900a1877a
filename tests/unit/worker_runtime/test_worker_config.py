"""The worker runtime's pure parts: its configuration, backend choice and log prefix."""

from __future__ import annotations

import logging

import pytest

from elasticjob.worker_contract import (
    ENV_COLLECTIVE_TIMEOUT,
    ENV_DEFER_SIGTERM,
    ENV_HEARTBEAT_INTERVAL,
    ENV_HOSTNAME,
    ENV_JOB,
    ENV_ROUND_WAIT,
    ENV_TOKEN,
    WorkerConfig,
)
from elasticjob.worker_runtime.diagnostics.log import CONTEXT, get_logger
from elasticjob.worker_runtime.exceptions import HostsUpdatedInterrupt
from elasticjob.worker_runtime.rounds.devices import resolve_backend
from elasticjob.worker_runtime.runtime import Runtime
from tests.support.worker_env import FULL_ENV


def test_no_launcher_environment_means_standalone() -> None:
    assert WorkerConfig.from_env({}) is None


def test_config_from_environment() -> None:
    config = WorkerConfig.from_env(FULL_ENV)
    assert config is not None
    assert (config.job, config.hostname, config.local_rank) == ("demo", "127.0.1.7", 1)
    assert config.bind_address == "127.0.1.7", "binds to the host's own address by default"
    assert config.backend == "auto"


@pytest.mark.parametrize("missing", [ENV_JOB, ENV_TOKEN, ENV_HOSTNAME])
def test_partial_environment_is_a_clear_error(missing: str) -> None:
    env = {k: v for k, v in FULL_ENV.items() if k != missing}
    with pytest.raises(RuntimeError, match=missing):
        WorkerConfig.from_env(env)


def test_optional_settings_from_environment() -> None:
    config = WorkerConfig.from_env(
        FULL_ENV
        | {
            ENV_COLLECTIVE_TIMEOUT: "12.5",
            ENV_ROUND_WAIT: "30",
            ENV_HEARTBEAT_INTERVAL: "0.5",
            ENV_DEFER_SIGTERM: "1",
        }
    )
    assert config is not None
    assert (config.collective_timeout_s, config.round_wait_s) == (12.5, 30.0)
    assert (config.heartbeat_interval_s, config.defer_sigterm) == (0.5, True)
    default = WorkerConfig.from_env(FULL_ENV)
    assert default is not None
    assert (default.collective_timeout_s, default.round_wait_s) == (60.0, 900.0)
    assert (default.heartbeat_interval_s, default.defer_sigterm) == (0.0, False)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (ENV_COLLECTIVE_TIMEOUT, "soon"),
        (ENV_ROUND_WAIT, "-1"),
        (ENV_HEARTBEAT_INTERVAL, "nan"),
        (ENV_HEARTBEAT_INTERVAL, "inf"),
    ],
)
def test_malformed_seconds_are_a_clear_error(name: str, value: str) -> None:
    with pytest.raises(ValueError, match=f"{name} must be"):
        WorkerConfig.from_env(FULL_ENV | {name: value})


def test_backend_choice() -> None:
    assert resolve_backend("gloo") == "gloo"
    assert resolve_backend("nccl") == "nccl"
    assert resolve_backend("auto") in ("gloo", "nccl")
    with pytest.raises(ValueError, match="mpi"):
        resolve_backend("mpi")


def test_log_lines_carry_job_round_rank_and_step(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    for field, value in {"job": "demo", "round": 3, "rank": 2, "step": 41}.items():
        monkeypatch.setattr(CONTEXT, field, value)
    with caplog.at_level(logging.INFO):
        get_logger("elasticjob.test").info("hello %s", "world")
    logged = [r.getMessage() for r in caplog.records if r.name == "elasticjob.test"]
    assert logged == ["[demo round=3 rank=2 step=41] hello world"]


def test_a_vote_settled_by_the_optimizer_step_decides_the_next_check() -> None:
    runtime = Runtime(None)  # standalone: a world of one
    runtime.start()
    try:
        runtime.settle_host_update_vote(1e-7)  # rounding noise of a float reduction
        runtime.check_host_updates()
        runtime.settle_host_update_vote(1.0)  # some rank saw hosts notice 1
        with pytest.raises(HostsUpdatedInterrupt):
            runtime.check_host_updates()
        runtime.check_host_updates()  # the settled vote is used once; this one reduces itself
    finally:
        runtime.shutdown()
