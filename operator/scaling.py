"""How many worker pods a job runs, and which pods to create, drain or delete: one pure
decision per reconciliation (:func:`plan_pods`), which the controller carries out.

The desired count is ``spec.replicas`` as :func:`read_spec` clamps it into [minReplicas,
maxReplicas]. The driver forms rounds from the hosts the plan lists (``PodPlan.hosts``); it
never creates pods (its launcher only deletes the pod of a worker that must stop), so this is
the job's only scaling loop.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from elasticjob.operator.api import (
    CleanPodPolicy,
    ElasticJobSpec,
    InvalidSpecError,
    parse_spec,
)
from elasticjob.operator.api.podschema import PodSchema
from elasticjob.operator.pod_blacklist import is_blacklisted
from elasticjob.operator.pods import PodState, PodView, newest_first

logger = logging.getLogger(__name__)

_MIN_REPLICAS_DEFAULT: int = ElasticJobSpec.model_fields["min_replicas"].default


@dataclass(frozen=True)
class ReplicasClamp:
    """spec.replicas was out of range; the job runs ``used`` worker pods instead."""

    requested: int
    used: int
    min_replicas: int
    max_replicas: int

    def __str__(self) -> str:
        return (
            f"spec.replicas {self.requested} is outside [{self.min_replicas}, "
            f"{self.max_replicas}]; running {self.used} worker pods"
        )


def read_spec(
    raw: Mapping[str, Any], pod_schema: PodSchema | None = None
) -> tuple[ElasticJobSpec, ReplicasClamp | None]:
    """The spec as a model, like ``parse_spec``, except that a ``replicas`` outside
    [minReplicas, maxReplicas] (a scale without the admission webhook) is clamped to the
    nearest bound rather than refused; the clamp says so. Raises ``InvalidSpecError`` for
    any other broken rule."""
    try:
        return parse_spec(raw, pod_schema), None
    except InvalidSpecError as refused:
        requested, low = raw.get("replicas"), raw.get("minReplicas", _MIN_REPLICAS_DEFAULT)
        high = raw.get("maxReplicas")
        if not all(type(n) is int for n in (requested, low, high)):
            raise
        assert isinstance(requested, int) and isinstance(low, int) and isinstance(high, int)
        if not 1 <= low <= high or low <= requested <= high:
            raise
        used = min(max(requested, low), high)
        try:
            spec = parse_spec({**raw, "replicas": used}, pod_schema)
        except InvalidSpecError:
            raise refused from None
        return spec, ReplicasClamp(requested, used, low, high)


class SpecReader:
    """A job's spec as last read from it: validated again only when it changed (validating
    a pod template costs more than the rest of a reconcile); an invalid update is ignored,
    said once; a clamped ``replicas`` is told once per change (:meth:`new_clamp`)."""

    def __init__(self, job_id: str, pod_schema: PodSchema | None) -> None:
        self._job_id = job_id
        self._pod_schema = pod_schema
        self._raw: dict[str, Any] | None = None
        self._spec: ElasticJobSpec | None = None
        self.clamp: ReplicasClamp | None = None
        """How ``replicas`` is clamped now (None: it is in range)."""
        self._told: ReplicasClamp | None = None

    def first(self, raw: Mapping[str, Any]) -> ElasticJobSpec:
        """The spec the job starts with (:func:`read_spec`; raises ``InvalidSpecError``)."""
        self._raw = dict(raw)
        self._spec, self.clamp = read_spec(self._raw, self._pod_schema)
        return self._spec

    def current(self, raw: Mapping[str, Any]) -> ElasticJobSpec:
        """The spec as ``raw`` has it now; the one last read when ``raw`` is unchanged since
        or the update is invalid. Call :meth:`first` before."""
        assert self._spec is not None, "current() before first()"
        if raw == self._raw:
            return self._spec
        self._raw = dict(raw)
        try:
            self._spec, self.clamp = read_spec(self._raw, self._pod_schema)
        except InvalidSpecError as exc:
            logger.warning("job %s: ignoring an invalid spec update: %s", self._job_id, exc)
        return self._spec

    def new_clamp(self) -> ReplicasClamp | None:
        """The clamp, when it is new since last asked (None: none, or told already)."""
        new = self.clamp if self.clamp != self._told else None
        self._told = self.clamp
        return new


@dataclass(frozen=True)
class PodPlan:
    """What one reconciliation does to a job's pods."""

    create: int = 0
    """New worker pods to create (kept off the blacklisted nodes)."""
    drain: tuple[str, ...] = ()
    """Pods newly chosen to leave (scale-in, or a blacklisted node): no longer hosts, so the
    driver lets their workers go at the next round."""
    delete: tuple[str, ...] = ()
    """Pods chosen to leave that never ran: deleted now."""
    overdue: tuple[str, ...] = ()
    """Pods chosen to leave that did not exit within the removal deadline: reported failed
    and deleted."""
    forget: tuple[str, ...] = ()
    """Pods chosen to leave that are gone."""
    hosts: tuple[str, ...] = ()
    """The usable pods in rank order (a resumed round's members first, then oldest first):
    the driver's hosts. A pod still to pass its health check is not usable yet."""


def plan_pods(
    spec: ElasticJobSpec,
    views: Mapping[str, PodView],
    *,
    blacklisted: Collection[str],
    leaving: Mapping[str, float],
    deleted: Collection[str],
    rank_order: Sequence[str],
    now: float,
    removal_deadline_s: float,
) -> PodPlan:
    """Decide the pods of a job.

    ``blacklisted``: the nodes (or pods, per ``spec.blacklist.scope``) cooling down;
    ``leaving``: pods chosen to leave earlier, with the time they were chosen; ``deleted``:
    pods already deleted; ``rank_order``: the pods of a resumed round by rank.

    Running pods on blacklisted nodes leave gracefully; the newest pods leave when there are
    more than desired; pods are created while there are fewer. Pending pods chosen to leave
    are deleted at once, running ones only once their deadline has passed (normally their
    workers exit first, and their pods end)."""
    desired = spec.replicas
    scope = spec.blacklist.scope
    drain = [
        v.name
        for v in views.values()
        if v.state is PodState.RUNNING
        and v.name not in leaving
        and is_blacklisted(v, scope, blacklisted)
    ]
    chosen = set(leaving) | set(drain)
    live = [
        v
        for v in views.values()
        if v.state in (PodState.PENDING, PodState.RUNNING) and v.name not in chosen
    ]
    if len(live) > desired:
        extra = [v.name for v in newest_first(live, len(live) - desired)]
        drain += extra
        chosen |= set(extra)
    delete, overdue, forget = [], [], []
    for name in sorted(chosen):
        view = views.get(name)
        if view is None:
            forget.append(name)
        elif name in deleted:
            continue
        elif view.state is PodState.PENDING:
            delete.append(name)
        elif name in leaving and now - leaving[name] > removal_deadline_s:
            overdue.append(name)
    rank = {pod: i for i, pod in enumerate(rank_order)}
    usable = sorted(
        (
            v
            for v in views.values()
            if v.state is PodState.RUNNING
            and v.name not in chosen  # a running blacklisted pod drains: it is chosen
            and not v.unchecked  # it joins once it passed its health check
        ),
        key=lambda v: (rank.get(v.name, len(rank)), v.created, v.name),
    )
    return PodPlan(
        create=max(0, desired - len(live)),
        drain=tuple(drain),
        delete=tuple(delete),
        overdue=tuple(overdue),
        forget=tuple(forget),
        hosts=tuple(v.name for v in usable),
    )


def pods_to_clean(views: Sequence[PodView], policy: CleanPodPolicy) -> list[str]:
    """The pods to delete once the job has ended: all (All), those still pending or running
    (Running), those still pending (None: a pod that has not started has no logs to keep, and
    would only start to find its job over; a replacement made as the job failed is one)."""
    if policy is CleanPodPolicy.ALL:
        return [v.name for v in views]
    if policy is CleanPodPolicy.RUNNING:
        return [v.name for v in views if v.state in (PodState.PENDING, PodState.RUNNING)]
    return [v.name for v in views if v.state is PodState.PENDING]
