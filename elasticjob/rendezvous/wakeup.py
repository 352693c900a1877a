"""A broadcast wake-up for asyncio long-polls, and the bounded long-polls of a job."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from elasticjob.rendezvous.rendezvous_types import Refusal, RequestRefused

_T = TypeVar("_T")


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


class LongPolls:
    """The long-polls of one job: at most ``limit`` of them wait at once.

    ``closing()`` tells whether the service shuts down (then nothing waits)."""

    def __init__(self, limit: int, closing: Callable[[], bool]) -> None:
        self._limit = limit
        self._closing = closing
        self.held = 0
        """How many wait now."""

    def check_room(self) -> None:
        """Raise :class:`RequestRefused` if ``limit`` long-polls wait already."""
        if self.held >= self._limit:
            raise RequestRefused(
                Refusal.TOO_MANY_WAITS, f"the job holds {self.held} long-polls, as many as it may"
            )

    async def wait(
        self,
        answer: Callable[[], _T | None],
        wait_seconds: float,
        wakeup: Wakeup,
        timed_out: Callable[[], _T],
    ) -> _T:
        """``answer()`` once it is not None (checked at once and on every ``wakeup``), else
        ``timed_out()`` after ``wait_seconds``. Raises :class:`RequestRefused` (before
        waiting) if ``limit`` long-polls wait already."""
        found = answer()
        if found is not None:
            return found
        if wait_seconds <= 0 or self._closing():
            return timed_out()
        self.check_room()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_seconds
        self.held += 1
        try:
            while True:
                await wakeup.wait(deadline - loop.time())
                found = answer()
                if found is not None:
                    return found
                if deadline - loop.time() <= 0 or self._closing():
                    return timed_out()
        finally:
            self.held -= 1
