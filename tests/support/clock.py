"""The clocks the tests inject in place of ``time.monotonic``."""

from __future__ import annotations

import asyncio


class FakeClock:
    """A clock that stands still until the test moves it: calling it gives :attr:`now`, which
    the test sets or moves on (``clock.now += 5`` or :meth:`advance`)."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock ``seconds`` on."""
        self.now += seconds


class LateLoopClock:
    """The running event loop's time plus the lateness the test adds (as if the loop had been
    blocked that long); made on the loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.added = 0.0

    def __call__(self) -> float:
        return self.loop.time() + self.added
