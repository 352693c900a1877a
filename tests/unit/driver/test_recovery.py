"""How a job recovers, by its mode and settings: one derivation for both front ends."""

from __future__ import annotations

import pytest

from elasticjob.driver.driver_types import (
    DEFAULT_MAX_FAILED_ROUNDS_WITHOUT_COMMIT as STALLS,
)
from elasticjob.driver.driver_types import DEFAULT_MAX_RESTARTS, JobMode, Recovery, recovery


@pytest.mark.parametrize(
    ("mode", "max_restarts", "checkpoints", "max_stalls", "expected"),
    [
        pytest.param(
            JobMode.ELASTIC, None, False, None, Recovery(None, False, None, STALLS), id="elastic"
        ),
        pytest.param(
            JobMode.ELASTIC,
            None,
            True,
            None,
            Recovery(None, True, None, STALLS),
            id="elastic-checkpoints",
        ),
        pytest.param(
            JobMode.ELASTIC,
            2,
            False,
            None,
            Recovery(2, False, None, STALLS),
            id="elastic-limit-no-agent",
        ),
        pytest.param(
            JobMode.ELASTIC, None, False, 5, Recovery(None, False, None, 5), id="elastic-stalls"
        ),
        pytest.param(
            JobMode.ELASTIC,
            None,
            False,
            0,
            Recovery(None, False, None, None),
            id="elastic-stalls-off",
        ),
        pytest.param(
            JobMode.RESTART,
            None,
            False,
            None,
            Recovery(DEFAULT_MAX_RESTARTS, True, DEFAULT_MAX_RESTARTS, None),
            id="restart-default",
        ),
        pytest.param(
            JobMode.RESTART, 0, False, None, Recovery(0, True, 0, None), id="restart-never"
        ),
        pytest.param(
            JobMode.RESTART, 7, True, 2, Recovery(7, True, 7, None), id="restart-no-stall-rule"
        ),
    ],
)
def test_recovery_by_mode(
    mode: JobMode,
    max_restarts: int | None,
    checkpoints: bool,
    max_stalls: int | None,
    expected: Recovery,
) -> None:
    found = recovery(
        mode,
        max_restarts=max_restarts,
        checkpoints=checkpoints,
        max_failed_rounds_without_commit=max_stalls,
    )
    assert found == expected
