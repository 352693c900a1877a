"""A job's blacklist under the operator: its one owner there is the job's pod reconciler.

What a failed pod keeps out depends on the job's ``blacklist.scope``: the node it ran on
(Node) or the pod itself (Pod). Every failure strikes once, whoever learns of it first: the
pod reconciler (the pod failed, a worker in it was killed) or the driver (a worker that did not
register in time, a member that failed in a round): :class:`PodBlacklist` is the driver's
:class:`~elasticjob.driver.blacklist.HostBlacklist` too, its hosts being pods.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Final

from elasticjob.driver.blacklist import Blacklist, BlacklistPolicy, Exclusion
from elasticjob.driver.driver_types import Clock
from elasticjob.operator.api import BlacklistScope
from elasticjob.operator.pods import PodView

STRUCK_PODS_KEPT: Final = 4096
"""How many pods' strikes a blacklist remembers (the oldest are forgotten first)."""


def blacklist_key(view: PodView, scope: BlacklistScope) -> str | None:
    """What a failure of ``view`` blacklists, and what keeps it out: its node (scope Node;
    None while it has none) or itself (scope Pod)."""
    return (view.node if scope is BlacklistScope.NODE else view.name) or None


def is_blacklisted(view: PodView, scope: BlacklistScope, blacklisted: Collection[str]) -> bool:
    """Whether ``view`` is kept out: its node (scope Node) or itself (scope Pod) is
    blacklisted."""
    key = blacklist_key(view, scope)
    return key is not None and key in blacklisted


class PodBlacklist:
    """The nodes (or pods) a job keeps out, struck once per failed pod."""

    def __init__(
        self,
        scope: BlacklistScope,
        policy: BlacklistPolicy,
        clock: Clock,
        node_of: Callable[[str], str | None],
    ) -> None:
        """``node_of``: the node a pod of the job runs on (None: none, or unknown)."""
        self.scope = scope
        self.keys = Blacklist[str](policy, clock)
        """The nodes (scope Node) or pods (scope Pod) cooling down."""
        self._node_of = node_of
        self._struck: dict[str, None] = {}
        """The pods whose failure struck already (oldest first)."""

    def key_of(self, pod: str) -> str | None:
        """What a failure of ``pod`` strikes: its node, or itself."""
        return pod if self.scope is BlacklistScope.POD else self._node_of(pod)

    def exclude(self, pod: str) -> Exclusion | None:
        """Strike what a failure of ``pod`` blacklists, unless that failure struck already
        (or the pod has no node yet); return the exclusion (None: nothing new)."""
        key = self.key_of(pod)
        if key is None or pod in self._struck:
            return None
        self._struck[pod] = None
        while len(self._struck) > STRUCK_PODS_KEPT:
            del self._struck[next(iter(self._struck))]
        return self.keys.exclude(key)

    def __contains__(self, pod: object) -> bool:
        """Whether the pod ``pod`` is kept out (its node, or itself, is blacklisted)."""
        key = self.key_of(pod) if isinstance(pod, str) else None
        return key is not None and key in self.keys

    def active(self) -> Mapping[str, float]:
        """``{node or pod: cooldown end}`` for those kept out now."""
        return self.keys.active()

    def expire(self) -> list[str]:
        """Forget the cooldowns that have ended; return what they kept out."""
        return self.keys.expire()

    def strikes(self, key: str) -> int:
        """How many times the node or pod ``key`` was blacklisted."""
        return self.keys.strikes(key)

    def restore(self, key: str, until: float, strikes: int = 1) -> None:
        """Keep the node or pod ``key`` out until ``until``, as the job's record says."""
        self.keys.restore(key, until, strikes)

    def keeps_out(self, view: PodView) -> bool:
        """Whether the pod ``view`` is kept out now."""
        return is_blacklisted(view, self.scope, self.keys.active().keys())
