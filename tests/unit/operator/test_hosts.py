"""Pods as the driver's hosts: the job's spec in the driver's terms."""

from __future__ import annotations

from typing import Any

import pytest

from elasticjob.driver.driver_types import DEFAULT_MAX_FAILED_ROUNDS_WITHOUT_COMMIT, DriverSettings
from elasticjob.operator.api import parse_spec
from elasticjob.operator.pod_launcher import driver_settings
from tests.support.crd_model import with_changes


def settings(**fields: Any) -> DriverSettings:
    """Driver settings, the failed-rounds limit the spec's default unless given."""
    fields.setdefault("max_failed_rounds_without_commit", DEFAULT_MAX_FAILED_ROUNDS_WITHOUT_COMMIT)
    return DriverSettings(**fields)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"replicas": 3, "minReplicas": 2, "maxReplicas": 5},
            settings(min_np=2, max_np=5, heartbeat_timeout_s=5.0),
        ),
        (
            {"replicas": 2, "minReplicas": 1, "maxReplicas": 4, "slotsPerWorker": 2},
            settings(min_np=2, max_np=8, heartbeat_timeout_s=5.0),
        ),
        (
            {
                "resetLimit": 3,
                "elasticTimeoutSeconds": 60,
                "heartbeatTimeoutSeconds": 9,
                "startTimeoutSeconds": 600,
            },
            settings(
                min_np=2,
                max_np=5,
                reset_limit=3,
                elastic_timeout_s=60.0,
                heartbeat_timeout_s=9.0,
                start_timeout_s=600.0,
            ),
        ),
        ({"heartbeatTimeoutSeconds": 0}, settings(min_np=2, max_np=5)),
        (
            {"maxFailedRoundsWithoutCommit": 0},
            settings(
                min_np=2, max_np=5, heartbeat_timeout_s=5.0, max_failed_rounds_without_commit=None
            ),
        ),
    ],
    ids=[
        "pods",
        "slots-multiply",
        "limits-and-timeouts",
        "heartbeat-eviction-off",
        "failed-rounds-rule-off",
    ],
)
def test_driver_settings(changes: dict[str, Any], expected: DriverSettings) -> None:
    worker = {"name": "worker", "image": "img", "command": ["train"]}
    base = {"replicas": 3, "minReplicas": 2, "maxReplicas": 5}
    template = {"spec": {"containers": [worker]}}
    spec = parse_spec(with_changes(template=template, **{**base, **changes}))
    assert driver_settings(spec) == expected
