"""A worker's step pace: its steps' busy time (wall time less the time waited in
collectives), the median of the round's recent steps, started afresh each round."""

from __future__ import annotations

import pytest

from elasticjob.wire.messages import StepPace
from elasticjob.worker_runtime.diagnostics.step_pace import WINDOW, StepPaceMeter


class Clocks:
    def __init__(self) -> None:
        self.now = 0.0
        self.blocked = 0.0

    def step(self, busy_s: float, waited_s: float) -> None:
        self.now += busy_s + waited_s
        self.blocked += waited_s


def test_a_step_is_its_wall_time_less_its_wait_in_collectives() -> None:
    clocks = Clocks()
    meter = StepPaceMeter(lambda: clocks.blocked, lambda: clocks.now)
    meter.step_done(1)  # the round's first step: its start is unknown
    assert meter.pace() is None
    for _ in range(3):
        clocks.step(busy_s=0.2, waited_s=0.5)
        meter.step_done(1)
    pace = meter.pace()
    assert pace is not None and (pace.round, pace.steps) == (1, 3)
    assert pace.busy_s == pytest.approx(0.2)


def test_one_slow_step_does_not_move_the_median() -> None:
    clocks = Clocks()
    meter = StepPaceMeter(lambda: clocks.blocked, lambda: clocks.now)
    meter.step_done(1)
    for busy in (0.1, 0.1, 5.0, 0.1, 0.1):
        clocks.step(busy_s=busy, waited_s=0.0)
        meter.step_done(1)
    pace = meter.pace()
    assert pace is not None and pace.busy_s == 0.1


def test_a_new_round_starts_afresh_and_the_window_is_bounded() -> None:
    clocks = Clocks()
    meter = StepPaceMeter(lambda: clocks.blocked, lambda: clocks.now)
    meter.step_done(1)
    for _ in range(WINDOW + 10):
        clocks.step(busy_s=1.0, waited_s=0.0)
        meter.step_done(1)
    for _ in range(WINDOW):
        clocks.step(busy_s=0.25, waited_s=0.0)
        meter.step_done(1)
    assert meter.pace() == StepPace(round=1, steps=2 * WINDOW + 10, busy_s=0.25)
    clocks.step(busy_s=9.0, waited_s=0.0)  # joining the next round
    meter.step_done(2)
    assert meter.pace() is None
    clocks.step(busy_s=0.5, waited_s=0.0)
    meter.step_done(2)
    assert meter.pace() == StepPace(round=2, steps=1, busy_s=0.5)
