"""The models of an ElasticJob's spec.

They accept exactly what the API server stores: camelCase keys only, unknown keys refused,
integers never coerced from strings, floats or booleans. So a spec that validates dumps back
(``by_alias=True, exclude_unset=True``) to the same document.
"""

from __future__ import annotations

import enum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr
from pydantic.alias_generators import to_camel

from elasticjob.checkpoint_policy import DEFAULT_KEEP, CheckpointPolicy
from elasticjob.driver.blacklist import BlacklistPolicy
from elasticjob.driver.driver_types import (
    DEFAULT_MAX_FAILED_ROUNDS_WITHOUT_COMMIT,
    DEFAULT_START_TIMEOUT_S,
    JobMode,
)
from elasticjob.driver.liveness import DEFAULT_HEARTBEAT_TIMEOUT_S
from elasticjob.driver.stragglers import StragglerPolicy
from elasticjob.operator.api.names import WORKER_CONTAINER
from elasticjob.rendezvous.health_rule import DEFAULT_MIN_RELATIVE, DEFAULT_TIMEOUT_S, HealthPolicy

Count = Annotated[StrictInt, Field(ge=1)]
"""A number of pods (or seconds) that must be positive."""


class _Spec(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, extra="forbid", frozen=True, use_attribute_docstrings=True
    )


class _PassThrough(BaseModel):
    """Part of the pod template: fields not modelled here are kept as they are."""

    model_config = ConfigDict(
        alias_generator=to_camel, extra="allow", frozen=True, use_attribute_docstrings=True
    )


class Backend(enum.StrEnum):
    """The torch.distributed backend of the workers."""

    GLOO = "gloo"
    NCCL = "nccl"
    AUTO = "auto"


class BlacklistScope(enum.StrEnum):
    """What a worker failure blacklists."""

    NODE = "Node"
    POD = "Pod"


class CleanPodPolicy(enum.StrEnum):
    """Which worker pods are deleted when the job completes."""

    ALL = "All"
    RUNNING = "Running"
    NONE = "None"


class StragglerAction(enum.StrEnum):
    """What follows when a worker is found to be a straggler."""

    REPORT = "Report"
    """Status, an event and a metric say so."""
    REPLACE = "Replace"
    """Reported, and replaced: its node (or pod, with blacklist scope Pod) is blacklisted
    with the usual cooldown, its pod drains gracefully (the others train on, no rollback)
    and a new pod starts elsewhere."""


class StragglerSpec(_Spec):
    """When a worker counts as a straggler: its steps keep it busy (their time less the time
    it waits for the others in collectives) at least ``slowdown`` times as long as the
    other workers' median, for ``forSeconds`` without a break, after the round's first 20
    steps. Workers report their pace with their heartbeats."""

    slowdown: Annotated[float, Field(strict=False, ge=1.1, le=100.0, allow_inf_nan=False)] = 1.5
    for_seconds: Annotated[StrictInt, Field(ge=0, le=86400)] = 60
    action: StragglerAction = StragglerAction.REPORT

    def policy(self) -> StragglerPolicy:
        """The driver's straggler policy this spec asks for."""
        return StragglerPolicy(
            float(self.slowdown),
            float(self.for_seconds),
            replace=self.action is StragglerAction.REPLACE,
        )


class HealthCheckSpec(_Spec):
    """A check each new worker pod runs before it may join a round: one all-reduce with the
    other pods starting at about the same time, and a compute and a copy micro-benchmark.
    A pod that fails it, or whose compute or copy figure is below ``minRelative`` times its
    peers' median, is not admitted: its node (or itself, with blacklist scope Pod) is
    blacklisted with the usual cooldown, and the pod is deleted and replaced. The job's
    members train on meanwhile; they never wait for a check."""

    min_relative: Annotated[float, Field(strict=False, ge=0.01, le=1.0, allow_inf_nan=False)] = (
        DEFAULT_MIN_RELATIVE
    )
    timeout_seconds: Annotated[StrictInt, Field(ge=10, le=3600)] = int(DEFAULT_TIMEOUT_S)
    """A pod not judged this long after it started running fails its check."""

    def policy(self) -> HealthPolicy:
        """The rendezvous service's health policy this spec asks for."""
        return HealthPolicy(float(self.min_relative), float(self.timeout_seconds))


class CooldownRange(_Spec):
    """Blacklist cooldown in seconds: the n-th blacklisting of the same node (or pod) lasts
    min(max, min * 2^(n-1)) seconds. min must not exceed max."""

    min: Count = 10
    max: Count = 300


class BlacklistSpec(_Spec):
    """How failed nodes (or pods) are kept out of the job for a while."""

    cooldown_seconds: CooldownRange = CooldownRange()
    scope: BlacklistScope = BlacklistScope.NODE
    """Node: the failed pod's node is blacklisted, so replacement pods avoid it until its
    cooldown ends (they are kept off it by node affinity). Pod: only the failed pod is, and
    its replacement may land on the same node."""

    def policy(self) -> BlacklistPolicy:
        """The cooldown policy of the blacklisting this spec asks for."""
        return BlacklistPolicy(float(self.cooldown_seconds.min), float(self.cooldown_seconds.max))


class CheckpointSpec(_Spec):
    """Durable checkpoints, the fallback when no worker of a round survives (every pod
    evicted, every node blacklisted): rank 0 writes the committed state (model, optimizer,
    sampler position, its own attributes) under path, off the training thread (a
    ShardedState's ranks each write their shards, in torch.distributed.checkpoint format,
    also the fallback for shards its copies lost), and a new round of fresh pods starts from
    the newest complete checkpoint there. Memory stays the
    first resort: while any worker survives, nothing is read from disk. Give everyCommits or
    intervalSeconds (exactly one)."""

    volume: Annotated[StrictStr, Field(min_length=1)]
    """Name of a volume of the pod template (template.spec.volumes), typically a
    persistentVolumeClaim that every pod of the job mounts: the checkpoints must outlive
    the pods, and a new rank 0 on any node must read them."""
    path: Annotated[StrictStr, Field(min_length=1)]
    """Absolute path of the checkpoint folder in the worker container; the operator mounts
    the volume there unless the worker container already does."""
    every_commits: Annotated[StrictInt, Field(ge=1)] | None = None
    """Write a checkpoint every this many commits."""
    interval_seconds: Annotated[StrictInt, Field(ge=1, le=86400)] | None = None
    """Write a checkpoint at the first commit this many seconds after the previous one."""
    keep: Annotated[StrictInt, Field(ge=1, le=1000)] = DEFAULT_KEEP
    """How many complete checkpoints to keep (the newest ones)."""

    def policy(self) -> CheckpointPolicy:
        """The checkpoint policy the workers are told."""
        return CheckpointPolicy(
            folder=self.path,
            every_commits=self.every_commits or 0,
            interval_s=float(self.interval_seconds or 0),
            keep=self.keep,
        )


class TemplateMetadata(_PassThrough):
    """Metadata of the worker pods (an ObjectMeta). The operator adds its own labels."""

    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class Container(_PassThrough):
    """A container of the worker pods (a core/v1 Container)."""

    name: Annotated[StrictStr, Field(min_length=1)]


class PodSpec(_PassThrough):
    """Spec of the worker pods (a core/v1 PodSpec). Every field is passed to the pods."""

    containers: Annotated[list[Container], Field(min_length=1)]
    """The pod's containers: the worker runtime runs in the one named "worker", or in the
    only container when there is one."""
    scheduler_name: StrictStr | None = None
    """Passed through, e.g. for a gang scheduler."""
    priority_class_name: StrictStr | None = None
    """Passed through, e.g. for a gang scheduler."""

    def worker_container(self) -> Container | None:
        """The container the worker runtime runs in (None when the choice is ambiguous)."""
        if len(self.containers) == 1:
            return self.containers[0]
        return next((c for c in self.containers if c.name == WORKER_CONTAINER), None)


class PodTemplateSpec(_PassThrough):
    """Template of the worker pods (a core/v1 PodTemplateSpec)."""

    metadata: TemplateMetadata | None = None
    spec: PodSpec


class ElasticJobSpec(_Spec):
    """Desired state of an elastic training job. Replica counts are worker pods; each pod runs
    slotsPerWorker worker processes."""

    replicas: Count
    """Desired number of worker pods, within [minReplicas, maxReplicas]. `kubectl scale` and
    autoscalers change it through the scale subresource."""
    min_replicas: Count = 1
    """Fewest worker pods training may run with."""
    max_replicas: Count
    """Most worker pods the job may grow to."""
    slots_per_worker: Annotated[StrictInt, Field(ge=1, le=64)] = 1
    """Worker processes per pod (e.g. GPUs per pod)."""
    template: PodTemplateSpec
    backend: Backend = Backend.AUTO
    """The torch.distributed backend; auto: NCCL when the worker sees a CUDA device, else
    Gloo."""
    mode: JobMode = JobMode.ELASTIC
    """How the script survives a change of the job's members: ``elastic``, it uses the elastic
    API and its processes keep their state; ``restart``, an unchanged torchrun script,
    stopped and started again in its pod with its new rank (pods that are healthy stay)."""
    max_restarts: Annotated[StrictInt, Field(ge=0)] | None = None
    """The job fails after this many restarts that follow a failure (torchrun's
    ``--max-restarts``; a change of hosts does not count); when absent, 3 in restart mode,
    unlimited in elastic mode."""
    max_failed_rounds_without_commit: Annotated[StrictInt, Field(ge=0, le=1000)] = (
        DEFAULT_MAX_FAILED_ROUNDS_WITHOUT_COMMIT
    )
    """Elastic mode: the job fails once this many rounds in a row failed with no new commit
    between them (a broken script, such as one that raises on one rank in every round), its
    status giving the failing worker's exception; a failure with a commit since the one
    before keeps the job going. 0: never."""
    warm_start: StrictBool = True
    """Restart mode: each agent forks its script's starts from a start server with torch
    imported (``false``: every start is cold, as under torchrun). Elastic mode, with
    ``slotsPerWorker`` above 1: each pod keeps a start server, and a slot's process restarted
    in place is forked from it (``false``: it starts cold)."""
    reset_limit: Annotated[StrictInt, Field(ge=0)] | None = None
    """The job fails after this many resets, counted as horovodrun's ``--reset-limit``
    counts them: every new round after the first, whether a failure or a change of hosts
    (``kubectl scale``, a pod added or gone) caused it; unlimited when absent."""
    elastic_timeout_seconds: Annotated[StrictInt, Field(ge=1, le=86400)] = 600
    """Seconds to wait for minReplicas pods to be available before the job fails."""
    start_timeout_seconds: Annotated[StrictInt, Field(ge=10, le=86400)] = int(
        DEFAULT_START_TIMEOUT_S
    )
    """How long a new worker may take, from the moment its pod runs to its registration with
    the rendezvous (its script started, torch imported), before it counts as failed: raise it
    for slow starts. A pod still pending (unschedulable, its image pulling) is not timed by it:
    ``elasticTimeoutSeconds`` bounds a job left without ``minReplicas`` pods."""
    active_deadline_seconds: Annotated[StrictInt, Field(ge=1)] | None = None
    """How long the job may run before it fails (reason DeadlineExceeded), its workers stopped
    and its pods cleaned up as ``cleanPodPolicy`` says, in seconds of its running time
    (batch/v1 Job's field): from its start, time suspended left out (a job created suspended
    starts counting when it is resumed; a suspended job resumes with the time it had left,
    where a Job's timer starts afresh). No deadline when absent."""
    ttl_seconds_after_finished: Annotated[StrictInt, Field(ge=0)] | None = None
    """Delete the ElasticJob (its pods, Secret and record with it) this many seconds after it
    Succeeded or Failed (batch/v1 Job's field; 0: at once); kept until deleted when absent. A
    suspended job has not finished."""
    heartbeat_timeout_seconds: Annotated[StrictInt, Field(ge=0, le=3600)] = (
        DEFAULT_HEARTBEAT_TIMEOUT_S
    )
    """A worker process that sends no heartbeat for this long (frozen, or cut off from the
    operator) is killed: its pod is deleted and counted as failed, and its node (or pod) is
    blacklisted. A slow step never stops the heartbeat. 0 turns this off."""
    collective_timeout_seconds: Annotated[StrictInt, Field(ge=1, le=86400)] | None = None
    """Bound on any collective of a worker, in seconds: a collective that takes longer fails
    the round (the worker runtime's default, 60, when absent)."""
    round_wait_seconds: Annotated[StrictInt, Field(ge=1, le=86400)] | None = None
    """How long a worker waits for its next round before it gives up, in seconds (the worker
    runtime's default, 900, when absent)."""
    blacklist: BlacklistSpec = BlacklistSpec()
    checkpoint: CheckpointSpec | None = None
    """Durable checkpoints (none when absent: a job that loses every worker fails)."""
    stragglers: StragglerSpec = StragglerSpec()
    """How a worker whose steps are consistently slower than the others' is found, and what
    follows (reported, or replaced)."""
    health_check: HealthCheckSpec | None = None
    """Check each new pod before it joins (none when absent)."""
    clean_pod_policy: CleanPodPolicy = CleanPodPolicy.RUNNING
    """All: every worker pod is deleted when the job ends. Running: only those still running
    (finished pods stay for their logs). None: only pods that have not started (no logs to
    keep) are deleted."""
    suspend: StrictBool = False
    """``true`` stops the job without losing work: the workers stop at the same step, rank 0
    writes the last commit as a durable checkpoint (with ``checkpoint``), the pods end and are
    deleted, and the job is Suspended; ``false`` starts it again from that checkpoint. A job
    created suspended creates no pods until then (the contract of queueing systems)."""
    allow_suspend_without_checkpoint: StrictBool = False
    """Allow suspending a job that has trained and has no ``checkpoint`` policy: it then
    starts afresh when resumed (refused in admission otherwise). Restart-mode scripts resume
    from checkpoints of their own and need no confirmation."""
