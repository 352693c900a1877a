"""When a job's status is written (``status_writer.write_due``): a table of changes."""

from __future__ import annotations

from typing import Any

import pytest

from elasticjob.operator.status_writer import PROGRESS_WRITE_INTERVAL_S, write_due

BASE: dict[str, Any] = {
    "phase": "Running",
    "round": 2,
    "worldSize": 4,
    "progress": {"epoch": 1, "step": 100, "samplesPerSecond": 50.0},
    "goodput": {"ratio": 0.9, "lostSeconds": {"recovery": 3.0}, "lastRecoverySeconds": 1.5},
}


def changed(**fields: Any) -> dict[str, Any]:
    return {**BASE, **fields}


SOON, LATER = 1.0, PROGRESS_WRITE_INTERVAL_S


@pytest.mark.parametrize(
    ("last", "status", "since", "ended", "expected"),
    [
        pytest.param(None, BASE, SOON, False, True, id="first-write"),
        pytest.param(BASE, BASE, LATER, False, False, id="unchanged"),
        pytest.param(BASE, BASE, SOON, True, True, id="ended-unchanged"),
        pytest.param(BASE, changed(round=3), SOON, False, True, id="round-changed"),
        pytest.param(BASE, changed(phase="Recovering"), SOON, False, True, id="phase-changed"),
        pytest.param(
            BASE, changed(progress={"epoch": 1, "step": 101}), SOON, False, False, id="step-soon"
        ),
        pytest.param(
            BASE, changed(progress={"epoch": 1, "step": 101}), LATER, False, True, id="step-later"
        ),
        pytest.param(
            BASE,
            changed(goodput={**BASE["goodput"], "ratio": 0.91}),
            SOON,
            False,
            False,
            id="goodput-ratio-soon",
        ),
        pytest.param(
            BASE,
            changed(goodput={**BASE["goodput"], "lastRecoverySeconds": 0.4}),
            SOON,
            False,
            True,
            id="new-recovery",
        ),
        pytest.param(
            BASE,
            changed(progress={"step": 101}, worldSize=3),
            SOON,
            False,
            True,
            id="step-and-size",
        ),
        pytest.param(BASE, changed(progress={"step": 101}), SOON, True, True, id="ended-step-soon"),
        pytest.param(
            BASE, changed(progress={"step": 101}), -SOON, False, True, id="clock-stepped-back"
        ),
    ],
)
def test_write_due(
    last: dict[str, Any] | None,
    status: dict[str, Any],
    since: float,
    ended: bool,
    expected: bool,
) -> None:
    assert write_due(last, status, last_at=100.0, now=100.0 + since, ended=ended) is expected
