"""The job's usable hosts, in a stable oldest-first order, with blacklisting.

A host is *usable* when discovery finds it and it is not cooling down from a blacklisting.
Usable hosts are ordered by the time they became usable: hosts that stay usable keep their
relative order and newly usable hosts go last, so the host holding rank 0 changes only when
it leaves. A blacklisted host leaves at once; after its cooldown it comes back, last, at the
next discovery if it is still there.
"""

from __future__ import annotations

import logging
import math
import time

from elasticjob.driver.api import BlacklistPolicy, Clock, HostDiscovery, HostUpdate

logger = logging.getLogger(__name__)


def cooldown_s(policy: BlacklistPolicy, strikes: int) -> float:
    """How long the ``strikes``-th blacklisting (1-based) of a host lasts under ``policy``."""
    if strikes < 1:
        raise ValueError(f"strikes must be at least 1, got {strikes}")
    doublings = strikes - 1
    if doublings >= math.log2(policy.cooldown_max_s / policy.cooldown_min_s):
        return policy.cooldown_max_s
    return min(policy.cooldown_max_s, math.ldexp(policy.cooldown_min_s, doublings))


class HostManager:
    """Keeps the usable hosts in order and blacklists failed ones with exponential cooldown."""

    def __init__(
        self, discovery: HostDiscovery, policy: BlacklistPolicy, clock: Clock = time.monotonic
    ) -> None:
        self._discovery = discovery
        self._policy = policy
        self._clock = clock
        self._discovered: dict[str, int] = {}
        # Usable hosts and their slots, in the order they became usable.
        self._usable: dict[str, int] = {}
        self._strikes: dict[str, int] = {}
        self._cooldown_until: dict[str, float] = {}

    @property
    def current_hosts(self) -> tuple[tuple[str, int], ...]:
        """The usable ``(host, slots)`` pairs, oldest first."""
        return tuple(self._usable.items())

    def update_available_hosts(self) -> HostUpdate:
        """Run discovery and return how the usable hosts changed since the previous view.

        Hosts whose cooldown has ended are usable again if discovery still finds them. A
        surviving host whose slot count changed keeps its place with its new slots and is
        reported neither added nor removed. :class:`DiscoveryError` propagates and leaves the
        view unchanged.
        """
        discovered = self._discovery.find_available_hosts_and_slots()
        now = self._clock()
        for host, until in list(self._cooldown_until.items()):
            if until <= now:
                del self._cooldown_until[host]
                logger.info("host %s finished its blacklist cooldown", host)
        self._discovered = dict(discovered)
        usable = {h: s for h, s in discovered.items() if h not in self._cooldown_until}
        removed = tuple(h for h in self._usable if h not in usable)
        added = tuple(h for h in usable if h not in self._usable)
        for host in removed:
            del self._usable[host]
        for host, slots in self._usable.items():
            if usable[host] != slots:
                logger.info("host %s now has %d slots instead of %d", host, usable[host], slots)
        self._usable = {h: usable[h] for h in (*self._usable, *added)}
        if added or removed:
            logger.debug("hosts added: %s; hosts removed: %s", list(added), list(removed))
        return HostUpdate(added=added, removed=removed)

    def blacklist(self, host: str) -> float:
        """Blacklist ``host`` now; return the monotonic time its cooldown ends.

        The n-th blacklisting of a host lasts ``min(max, min * 2 ** (n - 1))`` seconds of the
        policy. The host leaves :attr:`current_hosts` immediately.
        """
        strikes = self._strikes.get(host, 0) + 1
        self._strikes[host] = strikes
        duration = cooldown_s(self._policy, strikes)
        until = self._clock() + duration
        self._cooldown_until[host] = until
        self._usable.pop(host, None)
        logger.warning(
            "blacklisting host %s for %g s (blacklisting number %d)", host, duration, strikes
        )
        return until

    def is_blacklisted(self, host: str) -> bool:
        """Whether ``host`` is still cooling down from a blacklisting."""
        return self._cooldown_until.get(host, -math.inf) > self._clock()

    def blacklisted(self) -> dict[str, float]:
        """``{host: cooldown end}`` for the hosts still cooling down."""
        now = self._clock()
        return {h: until for h, until in self._cooldown_until.items() if until > now}

    def all_discovered_blacklisted(self) -> bool:
        """Whether the last discovery found hosts and every one of them is blacklisted."""
        cooling = self.blacklisted()
        return bool(self._discovered) and all(h in cooling for h in self._discovered)
