"""The models of an ElasticJob's status, which the operator writes: they accept snake_case
names too and ignore unknown keys.
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

NonNegative = Annotated[int, Field(ge=0)]


class _Status(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, use_attribute_docstrings=True
    )


class Phase(enum.StrEnum):
    """Where a job is in its life."""

    CREATED = "Created"
    RUNNING = "Running"
    SCALING = "Scaling"
    RECOVERING = "Recovering"
    DEGRADED = "Degraded"
    SUSPENDED = "Suspended"
    """spec.suspend: its state saved, no pods run until it is resumed."""
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class ConditionType(enum.StrEnum):
    """Types of the conditions of a job."""

    CREATED = "Created"
    RUNNING = "Running"
    SCALING = "Scaling"
    RECOVERING = "Recovering"
    DEGRADED = "Degraded"
    SUSPENDED = "Suspended"
    """True while the job is suspended (reason ``Suspended``); False once it resumed."""
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    INVALID_SPEC = "InvalidSpec"
    READY = "Ready"
    """True while training runs with at least minReplicas worker pods; it stays True through
    a scale-out or scale-in (``kubectl wait --for=condition=Ready``)."""
    REPLICAS_CLAMPED = "ReplicasClamped"
    """True while spec.replicas is outside [minReplicas, maxReplicas] and the operator runs
    the nearest bound instead."""


class ConditionStatus(enum.StrEnum):
    """Whether a condition holds."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(_Status):
    """One observation about the job, in the Kubernetes condition convention."""

    type: ConditionType
    status: ConditionStatus
    reason: str | None = None
    """A CamelCase word for programs."""
    message: str | None = None
    """A sentence for people."""
    last_transition_time: AwareDatetime
    observed_generation: NonNegative | None = None
    """The job's metadata.generation the condition was computed from."""


class WorkerStatus(_Status):
    """A worker pod of the current round."""

    pod: str
    node: str | None = None
    ranks: list[NonNegative] = []
    """Global ranks of the pod's processes."""


class StragglerStatus(_Status):
    """A worker of the current round found slower than the others (spec.stragglers)."""

    pod: str
    rank: NonNegative
    slowdown: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    """Its busy time per step, as a multiple of the other workers' median."""
    flagged: bool = False
    """It has stayed slow for spec.stragglers.forSeconds (False: slow, not for long yet)."""


class BlacklistedNode(_Status):
    """A node that new worker pods avoid until its cooldown ends."""

    node: str
    until: AwareDatetime
    strikes: Annotated[int, Field(ge=1)] = 1
    """How many times the node was blacklisted (its next cooldown doubles)."""


class Progress(_Status):
    """Training progress as rank 0 last reported it."""

    epoch: NonNegative = 0
    step: NonNegative = 0
    samples_per_second: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
    committed_step: NonNegative | None = None
    """The workers' step count at the newest commit: a restore from a checkpoint loses the
    steps between the checkpoint's and this."""


_Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class LostSeconds(_Status):
    """Wall time the job lost, by cause, since it started."""

    startup: _Seconds = 0.0
    """From the job's start to its first step."""
    recovery: _Seconds = 0.0
    """From failures to the first step of the next round."""
    rollback: _Seconds = 0.0
    """Training after the last commit before a failure, thrown away by the rollback."""
    resize: _Seconds = 0.0
    """Pauses of graceful resizes (hosts added or removed)."""


class Goodput(_Status):
    """How much of the job's wall time was productive."""

    ratio: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] = 1.0
    """Share of the wall time since the job started spent in productive steps."""
    lost_seconds: LostSeconds = LostSeconds()
    last_recovery_seconds: _Seconds | None = None
    """Time to recover of the latest failure (failure -> training resumed)."""
    suspended_seconds: _Seconds = 0.0
    """Wall time the job spent suspended (spec.suspend), before its latest resumption: left
    out of the ratio, which covers the time the job was meant to run."""


class CheckpointStatus(_Status):
    """A durable checkpoint rank 0 wrote."""

    name: str
    """Its name in the checkpoint folder."""
    epoch: NonNegative = 0
    step: NonNegative = 0
    """The step count at the commit it holds."""
    seconds: _Seconds = 0.0
    """How long writing it took."""
    size_bytes: NonNegative = 0


class RestoreStatus(_Status):
    """The latest durable fallback: no worker survived, and the new round's rank 0 loaded
    a checkpoint."""

    checkpoint: CheckpointStatus
    """The checkpoint it loaded (its seconds: how long loading took)."""
    round: NonNegative = 0
    """The round that started from it."""
    steps_lost: NonNegative | None = None
    """Committed steps trained again: the last step reported before the loss minus the
    checkpoint's (absent when unknown)."""
    time: AwareDatetime | None = None
    """When training resumed from it."""


class ElasticJobStatus(_Status):
    """Observed state of an elastic training job, written by the operator."""

    phase: Phase | None = None
    """Degraded: training runs with fewer live worker pods than desired."""
    observed_generation: NonNegative | None = None
    """The job's metadata.generation this status was computed from."""
    conditions: list[Condition] = []
    """InvalidSpec (True): the spec breaks a rule the schema cannot express, and the
    operator does not act on the job until it is fixed. Ready (True): training runs with at
    least minReplicas worker pods. ReplicasClamped (True): spec.replicas is out of range and
    the nearest bound is used."""
    replicas: NonNegative = 0
    """Live worker pods."""
    selector: str | None = None
    """Label selector of the worker pods (for the scale subresource)."""
    round: NonNegative = 0
    """The current rendezvous round."""
    notice_seq: NonNegative = 0
    """The latest notice sequence number of the job's rendezvous; an operator that restarts
    continues numbering from it, so running workers keep hearing notices."""
    world_size: NonNegative = 0
    """Worker processes in the current round."""
    workers: list[WorkerStatus] = []
    stragglers: list[StragglerStatus] = []
    """Workers of the current round whose steps are slower than the others' (flagged once
    they stayed slow for spec.stragglers.forSeconds)."""
    blacklisted_nodes: list[BlacklistedNode] = []
    reset_count: NonNegative = 0
    restart_count: NonNegative = 0
    """Resets that followed a failure, which ``spec.maxRestarts`` limits (a change of hosts
    is a reset, not a restart)."""
    last_reset_reason: str | None = None
    start_time: AwareDatetime | None = None
    completion_time: AwareDatetime | None = None
    progress: Progress | None = None
    goodput: Goodput | None = None
    last_checkpoint: CheckpointStatus | None = None
    """The newest durable checkpoint rank 0 wrote (spec.checkpoint)."""
    restored: RestoreStatus | None = None
    """The latest durable fallback: which checkpoint was loaded and how many steps were
    lost."""
    history: list[str] = []
    """The job's story, a line per event, oldest first (the newest 20): rounds, failures,
    blacklisted nodes and until when, recoveries and their time, scale requests, fallbacks,
    suspensions, stragglers, failed health checks, operator handovers, the end. The job
    record (``elasticjob timeline``) keeps more."""
