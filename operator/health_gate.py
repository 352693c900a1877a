"""What a job's pod reconciler knows of its pods' health checks (``spec.healthCheck``): the
verdicts the rendezvous service pushed and not yet carried out, the pods that passed (their
label may not say so yet), and since when each unchecked pod runs.

A pod created for a job with a health check carries the label ``Pending``
(``LABEL_HEALTH_CHECK``) and is not offered to the driver until it passed. The service
judges (``elasticjob.rendezvous.health_checks``) and tells the gate
(:meth:`HealthGate.on_health_verdict`); on its next pass the reconciler labels a pod that
passed ``Passed`` (so an operator that takes over knows it) and fails one that failed, or that
was not judged within the timeout (:func:`overdue_checks`): its node is blacklisted and it is
deleted, as any failed pod.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from elasticjob.operator.pods import PodState, PodView
from elasticjob.rendezvous.health_checks import HealthChecks
from elasticjob.wire.health import HealthFigures, HealthVerdict, VerdictStatus


@dataclass(frozen=True)
class HeardVerdict:
    """A verdict the service pushed: ``pod`` passed or not, for ``reason``, in ``seconds``
    (None: it never reported)."""

    pod: str
    passed: bool
    reason: str
    seconds: float | None


def overdue_checks(
    views: Mapping[str, PodView], running_since: Mapping[str, float], now: float, timeout_s: float
) -> list[str]:
    """The unchecked running pods that have run ``timeout_s`` or longer without a verdict."""
    return sorted(
        name
        for name, view in views.items()
        if view.unchecked
        and view.state is PodState.RUNNING
        and now - running_since.get(name, now) >= timeout_s
    )


class HealthGate:
    """The health checks of one job's pods, as its pod reconciler sees them (see the module
    docstring). It is the service's :class:`~elasticjob.rendezvous.health_checks.HealthListener`."""

    def __init__(self, wake: Callable[[], None]) -> None:
        """``wake``: run the controller's next pass soon."""
        self._wake = wake
        self.checks: HealthChecks | None = None
        """The service's checks of the job (None: the job has no health check)."""
        self._heard: list[HeardVerdict] = []
        self._passed: set[str] = set()
        self._to_label: set[str] = set()
        self._running_since: dict[str, float] = {}

    def on_health_verdict(
        self,
        host: str,
        verdict: HealthVerdict,
        seconds: float | None,
        figures: HealthFigures | None,
    ) -> None:
        del figures  # the service keeps them as later pods' peers
        passed = verdict.status is VerdictStatus.PASSED
        self._heard.append(HeardVerdict(host, passed, verdict.reason, seconds))
        if passed:
            self._passed.add(host)
            self._to_label.add(host)
        self._wake()

    def take_verdicts(self) -> list[HeardVerdict]:
        """The verdicts heard since last taken."""
        taken, self._heard = self._heard, []
        return taken

    def to_label(self) -> list[str]:
        """The pods that passed and are not labelled ``Passed`` yet."""
        return sorted(self._to_label)

    def labelled(self, pod: str) -> None:
        """The pod ``pod`` is labelled ``Passed`` now: the service tells its check."""
        self._to_label.discard(pod)
        if self.checks is not None:
            self.checks.admitted(pod)

    def running_for(self, pod: str, now: float) -> float | None:
        """How long the unchecked pod ``pod`` has run as this gate saw it (None: unknown)."""
        since = self._running_since.get(pod)
        return None if since is None else now - since

    def observe(self, views: Mapping[str, PodView], now: float) -> dict[str, PodView]:
        """Take a pass's view of the pods: a pod that passed and was labelled is checked
        (whatever the label in ``views`` says yet); tell the service which pods await their
        check, and which will once they run; return the views. Pods that are gone are forgotten."""
        admitted = self._passed - self._to_label
        views = {
            name: dataclasses.replace(view, unchecked=False) if name in admitted else view
            for name, view in views.items()
        }
        awaiting = [n for n, v in views.items() if v.unchecked and v.state is PodState.RUNNING]
        coming = [n for n, v in views.items() if v.unchecked and v.state is PodState.PENDING]
        for name in awaiting:
            self._running_since.setdefault(name, now)
        self._forget(set(views))
        self._running_since = {n: t for n, t in self._running_since.items() if n in awaiting}
        if self.checks is not None:
            self.checks.expect(awaiting, coming)
        return views

    def overdue(self, views: Mapping[str, PodView], now: float, timeout_s: float) -> list[str]:
        """The unchecked pods not judged within ``timeout_s`` of running."""
        return overdue_checks(views, self._running_since, now, timeout_s)

    def _forget(self, present: Iterable[str]) -> None:
        present = set(present)
        self._passed &= present
        self._to_label &= present
