"""The job's usable hosts, in a stable oldest-first order, with blacklisting.

The front end tells the hosts it finds (:meth:`HostManager.update`; the local launcher polls
a discovery, the operator pushes its pods when they change). A host is *usable* when it was
found and is not cooling down from a blacklisting.
Usable hosts are ordered by the time they became usable: hosts that stay usable keep their
relative order and newly usable hosts go last, so the host holding rank 0 changes only when
it leaves. A blacklisted host leaves at once; after its cooldown it comes back, last, at the
next discovery if it is still there.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from elasticjob.driver.blacklist import Exclusion, HostBlacklist
from elasticjob.driver.driver_types import HostUpdate

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Capacity:
    """The hosts a round can use now (see :meth:`HostManager.capacity`)."""

    hosts: tuple[tuple[str, int], ...]
    """Usable ``(host, slots)``, oldest first."""
    every_host_blacklisted: bool = False
    """Discovery found hosts and every one of them is blacklisted."""
    blacklisted: tuple[str, ...] = ()
    discovery_error: str | None = None
    """Why the last host discovery failed, while it keeps failing (None: it worked)."""


class HostManager:
    """Keeps the usable hosts in order, leaving out those its blacklist keeps out."""

    def __init__(self, blacklist: HostBlacklist) -> None:
        """``blacklist``: the front end's own (see ``blacklist.HostBlacklist``)."""
        self.blacklist = blacklist
        """What keeps failed hosts out of the job."""
        self._discovered: dict[str, int] = {}
        # Usable hosts and their slots, in the order they became usable.
        self._usable: dict[str, int] = {}
        self.discovered = False
        """Whether hosts were ever found (a discovery ever worked)."""
        self.discovery_error: str | None = None
        """Why the last host discovery failed (None: it worked)."""

    @property
    def current_hosts(self) -> tuple[tuple[str, int], ...]:
        """The usable ``(host, slots)`` pairs, oldest first."""
        return tuple(self._usable.items())

    def update(self, discovered: Mapping[str, int]) -> HostUpdate:
        """Take ``{host: slots}`` as the hosts found now; return how the usable hosts changed
        since the previous view.

        Hosts whose cooldown has ended are usable again if they are still found. A surviving
        host whose slot count changed keeps its place with its new slots and is reported
        neither added nor removed."""
        self.discovered, self.discovery_error = True, None
        self.blacklist.expire()
        self._discovered = dict(discovered)
        usable = {h: s for h, s in discovered.items() if h not in self.blacklist}
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

    def discovery_failed(self, error: str) -> None:
        """A host discovery failed with ``error``: the view stays as it was, and the error is
        kept in :attr:`discovery_error` until a discovery works again."""
        self.discovery_error = error

    def exclude(self, host: str) -> Exclusion | None:
        """Blacklist ``host`` now (see :class:`HostBlacklist`); return what is kept out and
        until when (None: nothing new). The host leaves :attr:`current_hosts` immediately."""
        exclusion = self.blacklist.exclude(host)
        self._usable.pop(host, None)
        return exclusion

    def all_discovered_blacklisted(self) -> bool:
        """Whether the last discovery found hosts and every one of them is blacklisted."""
        return bool(self._discovered) and all(h in self.blacklist for h in self._discovered)

    def capacity(self) -> Capacity:
        """The usable hosts, and whether (and which) discovered hosts are blacklisted."""
        return Capacity(
            hosts=self.current_hosts,
            every_host_blacklisted=self.all_discovered_blacklisted(),
            blacklisted=tuple(self.blacklist.active()),
            discovery_error=self.discovery_error,
        )
