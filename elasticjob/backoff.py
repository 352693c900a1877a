"""Exponential backoff: the pauses between the attempts of something that may fail for a while.

The operator's API calls, the worker runtime's rendezvous client and notice polling, and the
local cluster's readiness waits all retry with it. It uses only the standard library, so that
every part of the project may import it.

A :class:`Backoff` is a policy (a value); :meth:`Backoff.delays` is its pauses without end, and
:meth:`Backoff.until` one operation's pauses that stop at a deadline, read from an injected
clock. The caller sleeps however it waits (a thread, an event, the event loop).
"""

from __future__ import annotations

import math
import random as _random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

Clock = Callable[[], float]
"""Seconds on a monotonic clock (``time.monotonic``)."""
Uniform = Callable[[], float]
"""A number drawn uniformly from [0, 1) (``random.random``)."""


@dataclass(frozen=True)
class Backoff:
    """Pauses of ``initial_s``, each next one ``factor`` times the last, at most ``max_s``.

    With ``jitter`` (0 to 1) each pause is shortened by up to that share of itself, drawn at
    random, so that clients that failed together do not all try again at the same moment."""

    initial_s: float
    factor: float = 2.0
    max_s: float = math.inf
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if not self.initial_s >= 0:
            raise ValueError(f"the first pause must be 0 s or more, got {self.initial_s}")
        if not self.factor >= 1:
            raise ValueError(f"the factor must be 1 or more, got {self.factor}")
        if not self.max_s >= self.initial_s:
            raise ValueError(
                f"the longest pause ({self.max_s} s) is shorter than the first ({self.initial_s} s)"
            )
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"the jitter must be between 0 and 1, got {self.jitter}")

    def delays(self, random: Uniform = _random.random) -> Iterator[float]:
        """The pauses, without end (``random``: the jitter's draws; none without jitter)."""
        delay = self.initial_s
        while True:
            yield delay * (1 - self.jitter * random()) if self.jitter else delay
            delay = min(delay * self.factor, self.max_s)

    def until(
        self, deadline: float, clock: Clock = time.monotonic, random: Uniform = _random.random
    ) -> Retries:
        """One operation's pauses: none that would end after ``deadline`` (a time of
        ``clock``)."""
        return Retries(self.delays(random), deadline, clock)


class Retries:
    """The pauses left to one operation before its deadline: each one the next of its
    backoff, as long as the attempt after it starts by the deadline.

    Iterating gives them until the deadline; :meth:`next_pause` also takes a pause the other
    side asked for (a ``Retry-After``)."""

    def __init__(self, delays: Iterator[float], deadline: float, clock: Clock) -> None:
        self._delays = delays
        self._deadline = deadline
        self._clock = clock

    def __iter__(self) -> Iterator[float]:
        return self

    def __next__(self) -> float:
        pause = self.next_pause()
        if pause is None:
            raise StopIteration
        return pause

    def next_pause(self, instead: float | None = None) -> float | None:
        """The pause before the next attempt, or None when that attempt would start after the
        deadline. ``instead``: a pause to take in place of the backoff's (whose pauses grow
        all the same)."""
        delay = next(self._delays)
        pause = delay if instead is None else instead
        if self._clock() + pause > self._deadline:
            return None
        return pause
