"""Waiting for an event with a timeout keeps a cancellation that comes as the event is set
(``asyncio.wait_for`` on Python 3.11 loses it, and a loop built on it never stops)."""

from __future__ import annotations

import asyncio

import pytest

from elasticjob.event_waits import wait_event

DEADLINE_S = 5.0


async def test_it_tells_whether_the_event_was_set_in_time() -> None:
    event = asyncio.Event()
    assert not await wait_event(event, 0.01)
    asyncio.get_running_loop().call_soon(event.set)
    assert await wait_event(event, DEADLINE_S)


async def test_a_cancellation_that_comes_as_the_event_is_set_stops_the_loop() -> None:
    event = asyncio.Event()
    passes = 0

    async def loop() -> None:
        nonlocal passes
        while True:
            await wait_event(event, 60.0)
            event.clear()
            passes += 1

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)
    event.set()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, DEADLINE_S)
    assert passes == 0
