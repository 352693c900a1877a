"""How ``elasticjob-run``'s heartbeat timeout reaches the driver and the workers."""

from __future__ import annotations

import pytest

from elasticjob.launcher.processes import WorkerEnvironment
from elasticjob.launcher.run_command import main
from elasticjob.rendezvous.job_credentials import JobKey
from elasticjob.wire.messages import WorkerId
from elasticjob.worker_contract import ENV_HEARTBEAT_INTERVAL, WorkerSettings
from tests.support.rendezvous_jobs import slot_of


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_bad_heartbeat_timeout_is_refused(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-np", "1", "--heartbeat-timeout", value, "true"]) == 2
    assert "--heartbeat-timeout must be >= 0 seconds" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("interval", "expected"),
    [(1.0, "1"), (None, None)],
)
def test_workers_are_told_their_heartbeat_interval(
    interval: float | None, expected: str | None
) -> None:
    settings = WorkerSettings.model_validate(
        {"rendezvous_url": "http://127.0.0.1:1", "job": "job", "heartbeat_interval_s": interval}
    )
    environment = WorkerEnvironment(settings, JobKey("the-key"))
    env = environment.for_worker(
        WorkerId("127.0.0.1", 0), "127.0.0.1", slot_of(WorkerId("127.0.0.1", 0))
    )
    assert env.get(ENV_HEARTBEAT_INTERVAL) == expected
