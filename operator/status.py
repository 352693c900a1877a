"""The ElasticJob's status as a pure function of what the controller observed."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from elasticjob.driver.driver import JobResult
from elasticjob.driver.driver import Phase as DriverPhase
from elasticjob.operator.api import ConditionType, Phase

_CONDITIONS = (
    ConditionType.CREATED,
    ConditionType.RUNNING,
    ConditionType.SCALING,
    ConditionType.RECOVERING,
    ConditionType.DEGRADED,
    ConditionType.SUCCEEDED,
    ConditionType.FAILED,
)


@dataclass(frozen=True)
class Observation:
    """What the controller knows about a job at one moment."""

    driver_phase: DriverPhase
    result: JobResult | None
    recovering: bool
    """The round being formed follows a failure."""
    desired: int
    live: int
    pending: int
    leaving: int
    round: int
    world_size: int
    workers: Sequence[Mapping[str, Any]] = ()
    blacklisted_nodes: Sequence[Mapping[str, Any]] = ()
    reset_count: int = 0
    last_reset_reason: str | None = None
    progress: Mapping[str, Any] | None = None
    invalid_spec: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


def phase_of(obs: Observation) -> tuple[Phase, str, str]:
    """The job's phase with a reason and a message."""
    if obs.invalid_spec is not None:
        return Phase.FAILED, "InvalidSpec", obs.invalid_spec
    if obs.result is not None:
        if obs.result.success:
            return Phase.SUCCEEDED, "TrainingFinished", obs.result.message
        return Phase.FAILED, "JobFailed", obs.result.message
    if obs.driver_phase is DriverPhase.STARTING:
        return Phase.CREATED, "Starting", f"waiting for {obs.desired} worker pods to register"
    if obs.driver_phase is DriverPhase.FORMING:
        if obs.recovering:
            return Phase.RECOVERING, "WorkerFailed", obs.last_reset_reason or "a worker failed"
        return Phase.SCALING, "Rendezvous", f"forming round {obs.round + 1}"
    if obs.leaving or obs.pending:
        return (
            Phase.SCALING,
            "Scaling",
            (
                f"{obs.live} live worker pods, {obs.desired} desired "
                f"({obs.pending} starting, {obs.leaving} leaving)"
            ),
        )
    if obs.live < obs.desired:
        return Phase.DEGRADED, "FewerWorkers", f"{obs.live} live worker pods, {obs.desired} desired"
    return Phase.RUNNING, "Training", f"round {obs.round}: {obs.world_size} workers"


def conditions(
    previous: Sequence[Mapping[str, Any]], phase: Phase, reason: str, message: str, now: str
) -> list[dict[str, Any]]:
    """Conditions in the Kubernetes convention: the current phase's condition True, the
    others False; a condition's lastTransitionTime changes only when its status changes.
    Created stays True once the job exists."""
    before = {c["type"]: c for c in previous}
    out = []
    for kind in _CONDITIONS:
        holds = kind.value == phase.value or kind is ConditionType.CREATED
        status = "True" if holds else "False"
        old = before.get(kind.value)
        changed = old is None or old.get("status") != status
        current = kind.value == phase.value
        condition = {
            "type": kind.value,
            "status": status,
            "reason": reason if current else (old or {}).get("reason"),
            "message": message if current else (old or {}).get("message"),
            "lastTransitionTime": now if changed else old["lastTransitionTime"],  # type: ignore[index]
        }
        # Empty strings are left out: the API server takes them for nulls and refuses them.
        out.append({key: value for key, value in condition.items() if value})
    if phase is Phase.FAILED and reason == "InvalidSpec":
        out.append(
            {
                "type": ConditionType.INVALID_SPEC.value,
                "status": "True",
                "reason": reason,
                "message": message,
                "lastTransitionTime": now,
            }
        )
    return out


def status_of(
    obs: Observation, previous: Mapping[str, Any], selector: str, now: datetime.datetime
) -> dict[str, Any]:
    """The status subresource for ``obs`` (``previous``: the status as it was)."""
    stamp = now.isoformat().replace("+00:00", "Z")
    phase, reason, message = phase_of(obs)
    status: dict[str, Any] = {
        "phase": phase.value,
        "conditions": conditions(previous.get("conditions", []), phase, reason, message, stamp),
        "replicas": obs.live,
        "selector": selector,
        "round": obs.round,
        "worldSize": obs.world_size,
        "workers": list(obs.workers),
        "blacklistedNodes": list(obs.blacklisted_nodes),
        "resetCount": obs.reset_count,
        "lastResetReason": obs.last_reset_reason,
        "startTime": previous.get("startTime") or stamp,
        "completionTime": previous.get("completionTime")
        or (stamp if phase in (Phase.SUCCEEDED, Phase.FAILED) else None),
        "progress": dict(obs.progress) if obs.progress else previous.get("progress"),
        **obs.extra,
    }
    return status
