"""One watch of the event loop for every driver on it: each subscribed driver hears that the
loop ran late, and the watch runs only while some driver is subscribed."""

from __future__ import annotations

import asyncio
import math

from elasticjob.driver.liveness import LOOP_LAG_S, Reachability
from elasticjob.driver.loop_lag import LoopLagWatch
from tests.support.clock import LateLoopClock

PROBE_S = 0.01


async def probes(count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(PROBE_S)


async def test_every_subscribed_driver_hears_that_the_loop_ran_late() -> None:
    clock = LateLoopClock()
    watch = LoopLagWatch(clock, probe_s=PROBE_S)
    first, second, gone = Reachability(), Reachability(), Reachability()
    with watch.subscribed(gone):
        await probes(3)
    with watch.subscribed(first), watch.subscribed(second):
        await probes(3)
        assert first.lagged_at == second.lagged_at == -math.inf, "on time"
        clock.added += 2 * LOOP_LAG_S
        await probes(3)
        assert first.lagged_at == second.lagged_at != -math.inf
    assert gone.lagged_at == -math.inf, "no longer subscribed"


async def test_the_watch_runs_only_while_a_driver_is_subscribed() -> None:
    watch = LoopLagWatch(LateLoopClock(), probe_s=PROBE_S)
    before = {t for t in asyncio.all_tasks() if t.get_name() == "loop lag"}
    with watch.subscribed(Reachability()):
        with watch.subscribed(Reachability()):
            running = {t for t in asyncio.all_tasks() if t.get_name() == "loop lag"} - before
            assert len(running) == 1, "one watch for both"
        assert not next(iter(running)).done(), "one driver still subscribed"
    await asyncio.sleep(0)
    assert next(iter(running)).cancelled()


async def test_a_driver_about_to_judge_silence_hears_of_a_late_loop_first() -> None:
    """After the loop was blocked, a driver's own timer may run before the watch's: catching
    up tells it the loop ran late before it kills anybody; once told, the watch's overdue
    check does not report the same lateness twice."""
    clock = LateLoopClock()
    watch = LoopLagWatch(clock, probe_s=PROBE_S)
    driver = Reachability()
    with watch.subscribed(driver):
        await probes(3)
        watch.catch_up()
        assert driver.lagged_at == -math.inf, "on time"
        clock.added += 2 * LOOP_LAG_S
        blocked_until = clock()
        watch.catch_up()
        told = driver.lagged_at
        assert told >= blocked_until
        assert driver.silence_counts_from() == told
        await probes(3)
        assert driver.lagged_at == told, "the overdue check was caught up"
    watch.catch_up()
    assert driver.lagged_at == told, "no longer subscribed"
