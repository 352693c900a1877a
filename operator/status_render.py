"""The ElasticJob's status as a pure function of what the controller observed
(``status_observation.py``): :func:`status_of` turns an observation into the
:class:`~elasticjob.operator.api.ElasticJobStatus` model: the phase with its reason
(:func:`phase_of`), the conditions (the phase's, ``Ready``, ``ReplicasClamped``,
``InvalidSpec``) and the rest.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence

from elasticjob.driver.driver_types import DriverPhase
from elasticjob.operator.api import (
    Condition,
    ConditionStatus,
    ConditionType,
    ElasticJobStatus,
    Phase,
    RestoreStatus,
)
from elasticjob.operator.status_observation import Observation

_PHASE_CONDITIONS = (
    ConditionType.CREATED,
    ConditionType.RUNNING,
    ConditionType.SCALING,
    ConditionType.RECOVERING,
    ConditionType.DEGRADED,
    ConditionType.SUCCEEDED,
    ConditionType.FAILED,
)


def phase_of(obs: Observation) -> tuple[Phase, str, str]:
    """The job's phase with a reason and a message."""
    pods = obs.pods
    unschedulable = (
        f"{pods.unschedulable} worker pod(s) cannot be scheduled: {pods.scheduler_message}"
    )
    if obs.invalid_spec is not None:
        return Phase.FAILED, "InvalidSpec", obs.invalid_spec
    if obs.result is not None:
        if obs.result.suspended:
            return Phase.SUSPENDED, "Suspended", obs.result.message
        if obs.result.success:
            return Phase.SUCCEEDED, "TrainingFinished", obs.result.message
        reason = "DeadlineExceeded" if obs.result.deadline_exceeded else "JobFailed"
        return Phase.FAILED, reason, obs.result.message
    if obs.driver_phase is DriverPhase.STARTING:
        if pods.unschedulable:
            return Phase.CREATED, "Unschedulable", unschedulable
        return Phase.CREATED, "Starting", f"waiting for {obs.desired} worker pods to register"
    if obs.driver_phase is DriverPhase.FORMING:
        if obs.recovering:
            return Phase.RECOVERING, "WorkerFailed", obs.last_reset_reason or "a worker failed"
        return Phase.SCALING, "Rendezvous", f"forming round {obs.round + 1}"
    if pods.leaving or pods.pending > pods.unschedulable:
        return (
            Phase.SCALING,
            "Scaling",
            (
                f"{pods.live} live worker pods, {obs.desired} desired "
                f"({pods.pending} starting, {pods.leaving} leaving)"
            ),
        )
    if pods.live < obs.desired:
        if pods.unschedulable:
            return Phase.DEGRADED, "Unschedulable", unschedulable
        return (
            Phase.DEGRADED,
            "FewerWorkers",
            f"{pods.live} live worker pods, {obs.desired} desired",
        )
    return Phase.RUNNING, "Training", f"round {obs.round}: {obs.world_size} workers"


def ready_of(obs: Observation) -> tuple[bool, str, str]:
    """Whether training runs with at least minReplicas worker pods, with a reason and a
    message. A scale-out or scale-in does not interrupt it; a failure does until the next
    round."""
    if obs.invalid_spec is not None:
        return False, "InvalidSpec", obs.invalid_spec
    if obs.result is not None:
        return False, "Suspended" if obs.result.suspended else "JobFinished", obs.result.message
    if obs.round == 0:
        return False, "Starting", "no round has formed yet"
    if obs.recovering:
        return False, "WorkerFailed", obs.last_reset_reason or "a worker failed"
    if obs.training_pods < obs.min_replicas:
        return (
            False,
            "FewerWorkers",
            f"{obs.training_pods} worker pods train, minReplicas is {obs.min_replicas}",
        )
    return True, "Training", f"training with at least minReplicas ({obs.min_replicas}) worker pods"


def _condition(
    kind: ConditionType,
    holds: bool,
    reason: str | None,
    message: str | None,
    before: Mapping[ConditionType, Condition],
    generation: int | None,
    now: datetime.datetime,
) -> Condition:
    status = ConditionStatus.TRUE if holds else ConditionStatus.FALSE
    old = before.get(kind)
    unchanged = old is not None and old.status is status
    return Condition(
        type=kind,
        status=status,
        reason=reason or None,  # the API server refuses empty strings here
        message=message or None,
        last_transition_time=old.last_transition_time if old is not None and unchanged else now,
        observed_generation=generation,
    )


def conditions(
    obs: Observation,
    previous: Sequence[Condition],
    generation: int | None,
    now: datetime.datetime,
) -> list[Condition]:
    """Conditions in the Kubernetes convention: the current phase's condition True (with the
    phase's reason), the other phases' False (keeping their last reason); Created stays True
    once the job exists; Suspended once the job was (False with reason Resumed after);
    Ready per :func:`ready_of`; ReplicasClamped and InvalidSpec when they hold (or held).
    A lastTransitionTime changes only when its condition's status does."""
    before = {c.type: c for c in previous}
    phase, reason, message = phase_of(obs)
    out = []
    for kind in _PHASE_CONDITIONS:
        current = kind is ConditionType(phase)
        old = before.get(kind)
        out.append(
            _condition(
                kind,
                current or kind is ConditionType.CREATED,
                reason if current else (old.reason if old else None),
                message if current else (old.message if old else None),
                before,
                generation,
                now,
            )
        )
    if phase is Phase.SUSPENDED or ConditionType.SUSPENDED in before:
        suspended = phase is Phase.SUSPENDED
        out.append(
            _condition(
                ConditionType.SUSPENDED,
                suspended,
                "Suspended" if suspended else "Resumed",
                message if suspended else "spec.suspend is false: the job runs",
                before,
                generation,
                now,
            )
        )
    ready, ready_reason, ready_message = ready_of(obs)
    out.append(
        _condition(ConditionType.READY, ready, ready_reason, ready_message, before, generation, now)
    )
    if obs.replicas_clamped is not None or ConditionType.REPLICAS_CLAMPED in before:
        clamped = obs.replicas_clamped is not None
        out.append(
            _condition(
                ConditionType.REPLICAS_CLAMPED,
                clamped,
                "ReplicasOutOfRange" if clamped else "ReplicasInRange",
                obs.replicas_clamped or "spec.replicas is within [minReplicas, maxReplicas]",
                before,
                generation,
                now,
            )
        )
    if obs.invalid_spec is not None:
        out.append(
            _condition(
                ConditionType.INVALID_SPEC, True, "InvalidSpec", message, before, generation, now
            )
        )
    return out


def status_of(
    obs: Observation,
    previous: ElasticJobStatus,
    selector: str,
    generation: int | None,
    now: datetime.datetime,
) -> ElasticJobStatus:
    """The status subresource for ``obs`` (``previous``: the status as it was; ``generation``:
    the metadata.generation of the spec ``obs`` follows)."""
    now = now.replace(microsecond=0)
    phase, _, _ = phase_of(obs)
    ended = phase in (Phase.SUCCEEDED, Phase.FAILED)
    return ElasticJobStatus(
        phase=phase,
        observed_generation=generation,
        conditions=conditions(obs, previous.conditions, generation, now),
        replicas=obs.pods.live,
        selector=selector,
        round=obs.round,
        notice_seq=obs.notice_seq,
        world_size=obs.world_size,
        workers=list(obs.workers),
        stragglers=list(obs.stragglers),
        blacklisted_nodes=list(obs.blacklisted_nodes),
        reset_count=obs.reset_count,
        restart_count=obs.restart_count,
        last_reset_reason=obs.last_reset_reason,
        start_time=previous.start_time or now,
        completion_time=previous.completion_time or (now if ended else None),
        progress=obs.progress or previous.progress,
        goodput=obs.goodput or previous.goodput,
        last_checkpoint=obs.last_checkpoint or previous.last_checkpoint,
        restored=_restored(obs.restored, previous.restored, now),
        history=list(obs.history) or previous.history,
    )


def _restored(
    restored: RestoreStatus | None, previous: RestoreStatus | None, now: datetime.datetime
) -> RestoreStatus | None:
    """The restore to show: a new one stamped ``now``, else the one shown before."""
    if restored is None or (previous is not None and previous.round >= restored.round):
        return previous
    return restored.model_copy(update={"time": now})
