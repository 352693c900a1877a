"""A broadcast wake-up for asyncio long-polls."""

from __future__ import annotations

import asyncio


class Wakeup:
    """Wakes every coroutine waiting on it; a wait started after :meth:`fire` waits anew.

    A long-poll checks its condition, then waits; as nothing runs between the check and the
    start of the wait (one event loop), a :meth:`fire` cannot slip in between and be missed.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        """Wake every current waiter."""
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, timeout: float) -> None:
        """Return when fired or after ``timeout`` seconds, whichever comes first."""
        event = self._event
        try:
            async with asyncio.timeout(timeout):
                await event.wait()
        except TimeoutError:
            pass
