"""How a job recovers, by its mode and settings: one derivation for both front ends."""

from __future__ import annotations

import pytest

from elasticjob.driver.driver_types import DEFAULT_MAX_RESTARTS, JobMode, Recovery, recovery


@pytest.mark.parametrize(
    ("mode", "max_restarts", "checkpoints", "expected"),
    [
        pytest.param(JobMode.ELASTIC, None, False, Recovery(None, False, None), id="elastic"),
        pytest.param(
            JobMode.ELASTIC, None, True, Recovery(None, True, None), id="elastic-checkpoints"
        ),
        pytest.param(
            JobMode.ELASTIC, 2, False, Recovery(2, False, None), id="elastic-limit-no-agent"
        ),
        pytest.param(
            JobMode.RESTART,
            None,
            False,
            Recovery(DEFAULT_MAX_RESTARTS, True, DEFAULT_MAX_RESTARTS),
            id="restart-default",
        ),
        pytest.param(JobMode.RESTART, 0, False, Recovery(0, True, 0), id="restart-never"),
        pytest.param(JobMode.RESTART, 7, True, Recovery(7, True, 7), id="restart-checkpoints"),
    ],
)
def test_recovery_by_mode(
    mode: JobMode, max_restarts: int | None, checkpoints: bool, expected: Recovery
) -> None:
    assert recovery(mode, max_restarts=max_restarts, checkpoints=checkpoints) == expected
