"""Blacklisting: keeping a failed host, node or pod out of a job for a while.

The one implementation of blacklisting, generic over what is kept out, with one owner per
front end: the local launcher's driver blacklists hosts (``Blacklist[str]`` of host names);
under the operator the job's pod reconciler owns a ``Blacklist[str]`` of nodes or pods per
the job's ``blacklist.scope``, and the driver blacklists through it (:class:`HostBlacklist`).
The n-th blacklisting of the same key lasts ``min(cooldown_max_s, cooldown_min_s * 2 ** (n -
1))`` seconds; nothing is blacklisted forever. Times are monotonic seconds from an injected clock.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, cast

from elasticjob.driver.driver_types import Clock

logger = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class BlacklistPolicy:
    """Exponential cooldown: the n-th blacklisting of a key lasts
    ``min(cooldown_max_s, cooldown_min_s * 2 ** (n - 1))`` seconds."""

    cooldown_min_s: float = 10.0
    cooldown_max_s: float = 300.0

    def __post_init__(self) -> None:
        if not 0 < self.cooldown_min_s <= self.cooldown_max_s:
            raise ValueError(
                "blacklist cooldown range must satisfy 0 < min <= max, got "
                f"{self.cooldown_min_s}..{self.cooldown_max_s}"
            )

    def cooldown_s(self, strikes: int) -> float:
        """How long the ``strikes``-th blacklisting (1-based) of a key lasts."""
        if strikes < 1:
            raise ValueError(f"strikes must be at least 1, got {strikes}")
        doublings = strikes - 1
        if doublings >= math.log2(self.cooldown_max_s / self.cooldown_min_s):
            return self.cooldown_max_s
        return min(self.cooldown_max_s, math.ldexp(self.cooldown_min_s, doublings))


@dataclass(frozen=True)
class Exclusion:
    """``key`` (a host, node or pod) is kept out until ``until`` (monotonic seconds)."""

    key: str
    until: float


class Blacklist(Generic[K]):
    """Keys cooling down from a blacklisting, and how often each was blacklisted."""

    def __init__(self, policy: BlacklistPolicy, clock: Clock = time.monotonic) -> None:
        self.policy = policy
        self._clock = clock
        self._strikes: dict[K, int] = {}
        self._until: dict[K, float] = {}

    def add(self, key: K) -> float:
        """Blacklist ``key`` now (one more strike); return the monotonic time its cooldown
        ends."""
        strikes = self._strikes.get(key, 0) + 1
        self._strikes[key] = strikes
        duration = self.policy.cooldown_s(strikes)
        self._until[key] = until = self._clock() + duration
        logger.warning("blacklisted %s for %g s (blacklisting number %d)", key, duration, strikes)
        return until

    def exclude(self, key: K) -> Exclusion:
        """Blacklist ``key`` now (see :meth:`add`), as :class:`HostBlacklist` says."""
        return Exclusion(str(key), self.add(key))

    def restore(self, key: K, until: float, strikes: int = 1) -> None:
        """Take over a blacklisting recorded elsewhere (a new driver of the job reads it from
        the job's record): ``key`` stays out until ``until`` (or a later end it already has),
        and counts at least ``strikes`` blacklistings."""
        self._strikes[key] = max(self._strikes.get(key, 0), strikes)
        self._until[key] = max(self._until.get(key, -math.inf), until)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is still cooling down."""
        return self._until.get(cast(K, key), -math.inf) > self._clock()

    def active(self) -> Mapping[K, float]:
        """``{key: cooldown end}`` for the keys still cooling down."""
        now = self._clock()
        return {key: until for key, until in self._until.items() if until > now}

    def expire(self) -> list[K]:
        """Forget the cooldowns that have ended (strikes are kept) and return their keys."""
        now = self._clock()
        ended = [key for key, until in self._until.items() if until <= now]
        for key in ended:
            del self._until[key]
            logger.info("%s finished its blacklist cooldown", key)
        return ended

    def strikes(self, key: K) -> int:
        """How many times ``key`` was blacklisted."""
        return self._strikes.get(key, 0)


class HostBlacklist(Protocol):
    """What the driver needs of whoever keeps failed hosts out of its job: a
    :class:`Blacklist` of host names (the local launcher), or the operator's blacklist of the
    nodes or pods its hosts run on."""

    def exclude(self, key: str) -> Exclusion | None:
        """Blacklist the host ``key`` (one more strike on it, or on the node it runs on);
        return what is kept out and until when, or None when nothing new is (the same
        failure kept it out already, or there is nothing to keep out)."""

    def __contains__(self, key: object) -> bool:
        """Whether the host ``key`` is kept out now."""

    def active(self) -> Mapping[str, float]:
        """``{what is kept out: cooldown end}``, for messages."""

    def expire(self) -> list[str]:
        """Forget the cooldowns that have ended; return what they kept out."""

    def strikes(self, key: str) -> int:
        """How many times ``key`` (as :meth:`active` names it) was blacklisted."""

    def restore(self, key: str, until: float, strikes: int = 1) -> None:
        """Keep ``key`` (as :meth:`active` names it) out until ``until`` (monotonic), as a
        previous driver of the job recorded it (see :meth:`Blacklist.restore`)."""
