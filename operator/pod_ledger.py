"""One owner of what a job's controller knows and did about each of its worker pods.

The pods as last seen (:class:`~elasticjob.operator.podmap.PodMap`), and per pod what the
controller did: reported its end to the driver (failed, with why, or succeeded), deleted it,
or chose it to drain (since when). Every failure goes through one transition,
:meth:`PodLedger.fail`, which reports a pod once, with its cause
(:class:`~elasticjob.driver.worker_exits.ExitCause`); what follows it is the driver's decision
(``worker_exits.decide_exit``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from elasticjob.driver.driver_types import Clock
from elasticjob.driver.worker_exits import ExitCause
from elasticjob.operator import pods as podlib
from elasticjob.operator.podmap import Pod, PodChange, PodMap


@dataclass(frozen=True)
class PodFailure:
    """One pod's failure, as reported to the driver."""

    name: str
    cause: ExitCause
    reason: str
    exit_code: int
    node: str | None = None


class PodLedger:
    """The pods of one job and what the controller did about each (see the module
    docstring)."""

    def __init__(self, clock: Clock) -> None:
        self.pods = PodMap(clock)
        """The pods as last seen."""
        self._failed: dict[str, str] = {}
        """Pods reported failed, with why."""
        self._succeeded: set[str] = set()
        self._deleted: set[str] = set()
        self._to_delete: dict[str, int | None] = {}
        """Pods to delete on the controller's next pass, with their grace period (None: the
        pod's own)."""
        self._draining: dict[str, float] = {}
        """Pods chosen to leave (scale-in, a blacklisted node), with when they were chosen."""

    # ---- what is known -----------------------------------------------------------------

    def node_of(self, name: str) -> str | None:
        """The node the pod ``name`` runs on (None: none yet, or the pod is gone)."""
        pod = self.pods.snapshot().get(name)
        node = None if pod is None else (pod.get("spec") or {}).get("nodeName")
        return None if node is None else str(node)

    def reported(self, name: str) -> bool:
        """Whether the end of the pod ``name`` was reported to the driver."""
        return name in self._failed or name in self._succeeded

    @property
    def deleted(self) -> frozenset[str]:
        """The pods the controller deleted."""
        return frozenset(self._deleted)

    @property
    def draining(self) -> Mapping[str, float]:
        """The pods chosen to leave, with when they were chosen."""
        return dict(self._draining)

    def views(self, not_ready_nodes: Iterable[str] = ()) -> dict[str, podlib.PodView]:
        """Every pod as the operator sees it (``pods.view``); a pod reported failed is
        failed, with why, even while its object still looks alive (a worker in it was
        killed)."""
        views = {}
        for name, pod in self.pods.snapshot().items():
            view = podlib.view(pod, not_ready_nodes=not_ready_nodes)
            reason = self._failed.get(name)
            if reason is not None and view.state is not podlib.PodState.FAILED:
                view = dataclasses.replace(view, state=podlib.PodState.FAILED, reason=reason)
            views[name] = view
        return views

    # ---- what happened -----------------------------------------------------------------

    def merge_event(self, event_type: str, pod: Pod) -> tuple[PodChange, list[PodFailure]]:
        """Merge a watch event or a create response (see ``PodMap.apply``); return the
        change and the failures of pods that vanished before they ended."""
        change = self.pods.apply(event_type, pod)
        return change, self._vanished(change)

    def merge_list(
        self, pods: Iterable[Pod], version: str | None
    ) -> tuple[PodChange, list[PodFailure]]:
        """Merge a list of the job's pods (see ``PodMap.replace``), as :meth:`merge_event`."""
        change = self.pods.replace(pods, version)
        return change, self._vanished(change)

    def _vanished(self, change: PodChange) -> list[PodFailure]:
        failures = []
        for name in change.removed:
            if name not in self._deleted:
                failure = self.fail(name, ExitCause.VANISHED, "the pod disappeared", 137)
                if failure is not None:
                    failures.append(failure)
        return failures

    def fail(self, name: str, cause: ExitCause, reason: str, exit_code: int) -> PodFailure | None:
        """The pod ``name`` failed: the one failure transition. Returns the failure to carry
        out, or None when the pod's end was reported already."""
        if self.reported(name):
            return None
        self._failed[name] = reason
        return PodFailure(name, cause, reason, exit_code, self.node_of(name))

    def succeed(self, name: str) -> bool:
        """The pod ``name`` succeeded; return whether that is news."""
        if self.reported(name):
            return False
        self._succeeded.add(name)
        return True

    def delete_soon(self, name: str, grace_s: int | None) -> None:
        """The pod ``name`` is to be deleted on the controller's next pass."""
        if name not in self._deleted:
            self._to_delete[name] = grace_s

    def take_deletions(self) -> list[tuple[str, int | None]]:
        """The pods to delete now, with their grace periods; they are taken off the list."""
        taken, self._to_delete = list(self._to_delete.items()), {}
        return taken

    def mark_deleted(self, name: str) -> bool:
        """The controller deletes the pod ``name``; return whether it had not already."""
        if name in self._deleted:
            return False
        self._deleted.add(name)
        return True

    def drain(self, name: str, now: float) -> None:
        """The pod ``name`` is chosen to leave at ``now``."""
        self._draining[name] = now

    def forget(self, name: str) -> None:
        """The pod ``name``, chosen to leave, is gone."""
        self._draining.pop(name, None)

    def adopted_round_gone(self, pods: Iterable[str]) -> list[PodFailure]:
        """The members of a recorded round (by pod) that are gone: each failed, they vanished
        while the operator was away. Told to the new driver even when the pod's deletion was
        seen before the driver started (its failure was then told to nobody)."""
        present = self.pods.snapshot()
        failures = []
        for name in pods:
            if name not in present:
                reason = "the pod disappeared while the operator was away"
                self._failed.setdefault(name, reason)
                failures.append(PodFailure(name, ExitCause.VANISHED, reason, 137))
        return failures


def killed_reason(reason: str) -> str:
    """Why a pod failed whose worker the driver killed (``reason``: how it stopped
    answering)."""
    return f"a worker process was killed: {reason}"
