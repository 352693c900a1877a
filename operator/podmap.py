"""A job's worker pods as last seen, merged informer-style from three sources that Kubernetes
does not order against each other: the pod watch, the controller's own create responses and
its periodic re-lists (a watch event can be missed, and a create response or a list can arrive
after a newer watch event of the same pod).

The merge rules, where the API server gives integer ``metadata.resourceVersion`` (etcd's
revisions, as every kube-apiserver does):

- a copy of a pod older than the one held is ignored (the Pending copy of a create response
  never overwrites the Running one a watch event brought first);
- a deleted pod is remembered by uid (a bounded set) and no late event or list brings it
  back;
- a re-list adds the pods the watch missed and drops those it holds that the list does not
  have, unless the copy held is newer than the list (created while the list was in flight).

Where a version is not an integer nothing is known to be newer: an incoming copy replaces the
held one, and a re-list drops nothing. The map also tells when to re-list (:class:`Resync`),
by the clock it is given; it makes no API call itself.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from elasticjob.driver.driver_types import Clock

Pod = Mapping[str, Any]

GONE_LIMIT: Final = 4096
"""How many deleted pods' uids a map remembers (the oldest are forgotten first)."""


def _integer(version: object) -> int | None:
    text = str(version or "")
    return int(text) if text.isdigit() else None


def _version(pod: Pod) -> int | None:
    return _integer((pod.get("metadata") or {}).get("resourceVersion"))


def _uid(pod: Pod) -> str | None:
    uid = (pod.get("metadata") or {}).get("uid")
    return None if uid is None else str(uid)


def _another(pod: Pod, held: Pod) -> bool:
    """Whether ``pod`` is known to be another pod than ``held`` (an earlier one of its name)."""
    uid, held_uid = _uid(pod), _uid(held)
    return uid is not None and held_uid is not None and uid != held_uid


def _listed_after(list_version: int | None, pod: Pod) -> bool:
    """Whether a list taken at ``list_version`` is known to be no older than ``pod``'s copy
    (so it would have held the pod, had the pod not been deleted in between)."""
    version = _version(pod)
    return list_version is not None and version is not None and list_version >= version


@dataclass(frozen=True)
class PodChange:
    """What one merge changed: whether the map did, and the names of the pods it removed (they
    were deleted)."""

    changed: bool
    removed: tuple[str, ...] = ()


UNCHANGED: Final = PodChange(False)


@dataclass(frozen=True)
class Resync:
    """When the controller re-lists its job's pods: every ``interval_s``, and sooner while the
    job waits for pods to become hosts and no change came for ``quiet_s`` (a missed watch
    event would otherwise keep it waiting until the next periodic re-list). The watch carries
    every change; the periodic re-list only catches what a broken watch missed, and each job
    makes its own (from the API server's watch cache): every 60 s, 3 lists a second at 200
    jobs (every 10 s it was 20, a sixth of the operator's API calls when idle)."""

    interval_s: float = 60.0
    quiet_s: float = 3.0

    def due(self, now: float, *, listed_at: float, changed_at: float, waiting: bool) -> bool:
        """Whether to re-list at ``now``, the last list having been at ``listed_at`` and the
        last change of the map at ``changed_at``."""
        if now - listed_at >= self.interval_s:
            return True
        return waiting and now - max(listed_at, changed_at) >= self.quiet_s


DEFAULT_RESYNC: Final = Resync()


class PodMap:
    """The pods of one job by name (see the module docstring for the rules)."""

    def __init__(
        self, clock: Clock, resync: Resync = DEFAULT_RESYNC, gone_limit: int = GONE_LIMIT
    ) -> None:
        self._pods: dict[str, Pod] = {}
        self._gone: OrderedDict[str, None] = OrderedDict()
        self._gone_limit = gone_limit
        self._clock, self._resync = clock, resync
        self._listed_at = self._changed_at = clock()

    def resync_due(self, waiting: bool) -> bool:
        """Whether to re-list now (see :class:`Resync`); ``waiting``: the job waits for pods
        to become hosts."""
        return self._resync.due(
            self._clock(), listed_at=self._listed_at, changed_at=self._changed_at, waiting=waiting
        )

    def snapshot(self) -> dict[str, Pod]:
        """The pods held, by name (a copy: later merges do not change it)."""
        return dict(self._pods)

    def apply(self, event_type: str, pod: Pod) -> PodChange:
        """Merge one watch event (``ADDED``, ``MODIFIED``, ``DELETED``) or a copy of a pod
        from a create response (as ``ADDED``)."""
        name = str(pod["metadata"]["name"])
        held = self._pods.get(name)
        if event_type == "DELETED":
            self._remember_gone(pod)
            if held is None or _another(pod, held):
                return UNCHANGED
            del self._pods[name]
            return self._changed((name,))
        if _uid(pod) in self._gone:
            return UNCHANGED
        if held is not None and not self._replaces(pod, held):
            return UNCHANGED
        self._pods[name] = dict(pod)
        return self._changed(())

    def replace(self, pods: Iterable[Pod], list_version: str | None) -> PodChange:
        """Merge a list of the job's pods taken at ``list_version`` (the list's
        ``metadata.resourceVersion``)."""
        self._listed_at = self._clock()
        listed = {str(pod["metadata"]["name"]): pod for pod in pods}
        at = _integer(list_version)
        removed = []
        for name, held in list(self._pods.items()):
            if name not in listed and _listed_after(at, held):
                removed.append(name)
                self._remember_gone(held)
                del self._pods[name]
        changed = bool(removed)
        for pod in listed.values():
            changed = self.apply("ADDED", pod).changed or changed
        return self._changed(tuple(removed)) if changed else UNCHANGED

    def _changed(self, removed: tuple[str, ...]) -> PodChange:
        self._changed_at = self._clock()
        return PodChange(True, removed)

    @staticmethod
    def _replaces(pod: Pod, held: Pod) -> bool:
        new, old = _version(pod), _version(held)
        if new is None or old is None:
            return pod != held
        return new > old

    def _remember_gone(self, pod: Pod) -> None:
        uid = _uid(pod)
        if uid is None:
            return
        self._gone[uid] = None
        self._gone.move_to_end(uid)
        while len(self._gone) > self._gone_limit:
            self._gone.popitem(last=False)
