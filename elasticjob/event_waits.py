"""Waiting for an :class:`asyncio.Event` with a timeout, without losing a cancellation.

On Python 3.11, ``asyncio.wait_for(event.wait(), timeout)`` returns normally when the event is
set in the same loop iteration as its task is cancelled: the cancellation is lost, and a loop
built on it (a driver's or a controller's) runs on after it was told to stop, so whoever
awaits its end waits forever. ``asyncio.timeout`` counts cancellations and keeps them.
Standard library only.
"""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until ``event`` is set or ``timeout_s`` passed; return whether it is set. A
    cancellation of the caller always propagates."""
    try:
        async with asyncio.timeout(timeout_s):
            await event.wait()
    except TimeoutError:
        return event.is_set()
    return True
