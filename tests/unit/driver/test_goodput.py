"""The lost-time accounting behind goodput and the time to recover: a row per transition."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from elasticjob.driver.goodput import (
    LostTime,
    LostTo,
    on_commit,
    on_failure,
    on_first_step,
    on_resize,
    on_restored,
)

Event = tuple[str, float]


def _apply(events: list[Event]) -> tuple[LostTime, list[float]]:
    state = LostTime.start(0.0)
    recoveries: list[float] = []
    steps: dict[str, Callable[[LostTime, float], LostTime]] = {
        "failure": on_failure,
        "resize": on_resize,
        "commit": on_commit,
        "restored": on_restored,  # its time is the restored checkpoint's commit
    }
    for kind, at in events:
        if kind == "step":
            state, recovery = on_first_step(state, at)
            if recovery is not None:
                recoveries.append(recovery)
        else:
            state = steps[kind](state, at)
    return state, recoveries


@pytest.mark.parametrize(
    ("events", "now", "lost", "recoveries"),
    [
        pytest.param([], 5.0, {LostTo.STARTUP: 5.0}, [], id="startup-under-way"),
        pytest.param([("step", 2.0)], 10.0, {LostTo.STARTUP: 2.0}, [], id="startup-ends"),
        pytest.param(
            [("step", 2.0), ("commit", 6.0), ("failure", 9.0), ("step", 10.5)],
            20.0,
            {LostTo.STARTUP: 2.0, LostTo.ROLLBACK: 3.0, LostTo.RECOVERY: 1.5},
            [1.5],
            id="failure-loses-work-since-commit-and-recovers",
        ),
        pytest.param(
            [("step", 2.0), ("failure", 5.0)],
            8.0,
            {LostTo.STARTUP: 2.0, LostTo.ROLLBACK: 3.0, LostTo.RECOVERY: 3.0},
            [],
            id="failure-before-any-commit-rolls-back-to-the-first-step",
        ),
        pytest.param(
            [("step", 2.0), ("resize", 4.0), ("step", 4.5)],
            10.0,
            {LostTo.STARTUP: 2.0, LostTo.RESIZE: 0.5},
            [],
            id="resize-pause-loses-no-work",
        ),
        pytest.param(
            [("step", 2.0), ("resize", 4.0), ("failure", 5.0), ("step", 7.0)],
            10.0,
            {LostTo.STARTUP: 2.0, LostTo.RECOVERY: 3.0},
            [3.0],
            id="failure-during-resize-becomes-recovery-from-the-pause",
        ),
        pytest.param(
            [("failure", 1.0), ("step", 3.0)],
            4.0,
            {LostTo.STARTUP: 3.0},
            [],
            id="failure-during-startup-stays-startup",
        ),
        pytest.param(
            [("step", 2.0), ("failure", 3.0), ("failure", 4.0), ("step", 6.0)],
            6.0,
            {LostTo.STARTUP: 2.0, LostTo.ROLLBACK: 1.0, LostTo.RECOVERY: 3.0},
            [3.0],
            id="second-failure-while-recovering-counts-once",
        ),
        pytest.param(
            [("step", 2.0), ("step", 3.0), ("commit", 4.0), ("resize", 4.0), ("commit", 4.2)],
            5.0,
            {LostTo.STARTUP: 2.0, LostTo.RESIZE: 1.0},
            [],
            id="steps-and-commits-while-training-or-paused-change-nothing",
        ),
        pytest.param(
            [("step", 2.0), ("commit", 8.0), ("failure", 9.0), ("restored", 5.0), ("step", 10.0)],
            12.0,
            {LostTo.STARTUP: 2.0, LostTo.ROLLBACK: 1.0 + 3.0, LostTo.RECOVERY: 1.0},
            [1.0],
            id="restored-checkpoint-older-than-the-last-commit-rolls-back-to-it",
        ),
        pytest.param(
            [("step", 2.0), ("resize", 8.0), ("failure", 9.0), ("restored", 5.0), ("step", 10.0)],
            12.0,
            {LostTo.STARTUP: 2.0, LostTo.ROLLBACK: 3.0, LostTo.RECOVERY: 2.0},
            [2.0],
            id="every-member-left-then-restored-loses-the-training-since-the-checkpoint",
        ),
        pytest.param(
            [("step", 2.0), ("commit", 8.0), ("failure", 9.0), ("restored", 8.5), ("step", 10.0)],
            12.0,
            {LostTo.STARTUP: 2.0, LostTo.ROLLBACK: 1.0, LostTo.RECOVERY: 1.0},
            [1.0],
            id="restored-checkpoint-newer-than-the-rollback-adds-nothing",
        ),
        pytest.param(
            [("step", 2.0), ("commit", 4.0), ("restored", 1.0), ("failure", 6.0)],
            6.0,
            {LostTo.STARTUP: 2.0, LostTo.ROLLBACK: 2.0},
            [],
            id="restored-outside-a-recovery-changes-nothing",
        ),
    ],
)
def test_lost_time(
    events: list[Event], now: float, lost: dict[LostTo, float], recoveries: list[float]
) -> None:
    state, seen = _apply(events)
    expected = dict.fromkeys(LostTo, 0.0) | lost
    assert dict(state.lost_seconds(now)) == pytest.approx(expected)
    assert seen == pytest.approx(recoveries)
    assert state.goodput(now) == pytest.approx(1.0 - sum(expected.values()) / now)


def test_goodput_is_one_at_the_start_and_the_last_recovery_is_kept() -> None:
    state = LostTime.start(3.0)
    assert state.goodput(3.0) == 1.0
    state, _ = _apply([("step", 1.0), ("failure", 2.0), ("step", 2.5), ("commit", 3.0)])
    assert state.last_recovery_s == pytest.approx(0.5)
    state, _ = on_first_step(on_resize(state, 4.0), 5.0)
    assert state.last_recovery_s == pytest.approx(0.5)


def test_a_restarted_driver_carries_on_the_accounting_from_the_status() -> None:
    state = LostTime.training(100.0).resumed({LostTo.RECOVERY: 5.0, LostTo.STARTUP: 5.0}, 40.0)
    assert state.goodput(110.0) == pytest.approx(1.0 - 10.0 / 50.0)
    state, recovery = on_first_step(state, 111.0)
    assert recovery is None, "it was training"
    state = on_failure(state, 120.0)
    assert state.lost_seconds(120.0)[LostTo.ROLLBACK] == pytest.approx(20.0), "since adoption"
