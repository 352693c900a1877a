"""What one pass of a job's controller observed, as the status shows it: :func:`observe`
gathers an :class:`Observation` from the driver's snapshot (its one read model) and the pods
(counted by :func:`pod_counts`), each field rendered as the status model has it (workers,
stragglers, progress, goodput, checkpoints, the restore). ``status_render.py`` makes the
status of it."""

from __future__ import annotations

import datetime
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from elasticjob.driver.driver_types import DriverPhase, JobResult
from elasticjob.driver.goodput import LostTime
from elasticjob.driver.job_snapshot import JobSnapshot
from elasticjob.driver.job_state import BlacklistEntry, JobState
from elasticjob.operator.api import (
    BlacklistedNode,
    CheckpointStatus,
    ElasticJobSpec,
    Goodput,
    LostSeconds,
    Progress,
    RestoreStatus,
    StragglerStatus,
    WorkerStatus,
)
from elasticjob.operator.pods import PodState, PodView
from elasticjob.wire.messages import CheckpointReport


@dataclass(frozen=True)
class PodCounts:
    """The job's worker pods by what they mean for its size."""

    live: int = 0
    """Running and staying."""
    pending: int = 0
    """Not running yet and staying (the unschedulable ones included)."""
    leaving: int = 0
    """Chosen to leave, or being deleted or preempted."""
    unschedulable: int = 0
    """Pending pods the scheduler finds no node for."""
    scheduler_message: str | None = None
    """What the scheduler says about one of them."""


def pod_counts(views: Mapping[str, PodView], leaving: Collection[str]) -> PodCounts:
    """Count ``views``; ``leaving``: the pods chosen to leave (see ``scaling.plan_pods``)."""
    staying = [v for v in views.values() if v.name not in leaving]
    unschedulable = [v for v in staying if v.unschedulable is not None]
    return PodCounts(
        live=sum(v.state is PodState.RUNNING for v in staying),
        pending=sum(v.state is PodState.PENDING for v in staying),
        leaving=len(set(leaving) | {v.name for v in staying if v.state is PodState.LEAVING}),
        unschedulable=len(unschedulable),
        scheduler_message=min((v.unschedulable or "" for v in unschedulable), default=None),
    )


@dataclass(frozen=True)
class Observation:
    """What the controller knows about a job at one moment."""

    driver_phase: DriverPhase
    result: JobResult | None
    recovering: bool
    """The round being formed follows a failure."""
    desired: int
    """Worker pods the job should have (``spec.replicas``, clamped)."""
    min_replicas: int
    pods: PodCounts
    round: int
    world_size: int
    training_pods: int = 0
    """Running pods that are members of the current round."""
    workers: Sequence[WorkerStatus] = ()
    stragglers: Sequence[StragglerStatus] = ()
    blacklisted_nodes: Sequence[BlacklistedNode] = ()
    reset_count: int = 0
    restart_count: int = 0
    last_reset_reason: str | None = None
    progress: Progress | None = None
    goodput: Goodput | None = None
    last_checkpoint: CheckpointStatus | None = None
    restored: RestoreStatus | None = None
    """The latest durable fallback (its ``time`` is set when the status first shows it)."""
    history: Sequence[str] = ()
    """The job's story (``job_story.history_of``; empty: keep the one shown)."""
    notice_seq: int = 0
    invalid_spec: str | None = None
    replicas_clamped: str | None = None
    """Why spec.replicas is not what the job runs (it is out of range), if it is not."""

    @classmethod
    def suspended(cls, message: str, spec: ElasticJobSpec, state: JobState) -> Observation:
        """A job suspended with no round to save (created suspended, or suspended while no
        operator ran it), whose record holds ``state``; ``message`` says so."""
        return cls(
            driver_phase=DriverPhase.STARTING,
            result=JobResult(False, message, state.last_round, state.resets, suspended=True),
            recovering=False,
            desired=spec.replicas,
            min_replicas=spec.min_replicas,
            pods=PodCounts(),
            round=state.last_round,
            world_size=0,
            reset_count=state.resets,
            restart_count=state.restarts,
            last_reset_reason=state.last_reset_reason,
        )

    @classmethod
    def refused(cls, invalid_spec: str) -> Observation:
        """A job whose spec the operator refuses (``invalid_spec`` says why)."""
        return cls(
            driver_phase=DriverPhase.STARTING,
            result=None,
            recovering=False,
            desired=0,
            min_replicas=0,
            pods=PodCounts(),
            round=0,
            world_size=0,
            invalid_spec=invalid_spec,
        )


def observe(
    job: JobSnapshot,
    spec: ElasticJobSpec,
    views: Mapping[str, PodView],
    leaving: Collection[str],
    blacklisted: Sequence[BlacklistedNode],
    replicas_clamped: str | None,
    suspended_s: float = 0.0,
    history: Sequence[str] = (),
) -> Observation:
    """What the driver (its snapshot ``job``) and the pods (``views``; ``leaving``: chosen to
    leave) say now; ``suspended_s``: the job's time suspended so far; ``history``: its story
    (``job_story.py``)."""
    suspended = job.result is not None and job.result.suspended
    ranks = {} if suspended else job.ranks_by_host()  # a suspended job has no members
    running = {name for name, v in views.items() if v.state is PodState.RUNNING}
    progress = job.progress
    return Observation(
        driver_phase=job.phase,
        result=job.result,
        recovering=job.recovering,
        desired=spec.replicas,
        min_replicas=spec.min_replicas,
        pods=pod_counts(views, leaving),
        round=job.round,
        world_size=0 if suspended else job.world_size,
        training_pods=len(ranks.keys() & running),
        workers=[
            WorkerStatus(pod=pod, node=views[pod].node if pod in views else None, ranks=r)
            for pod, r in sorted(ranks.items())
        ],
        stragglers=[] if suspended else stragglers_of(job),
        blacklisted_nodes=blacklisted,
        reset_count=job.reset_count,
        restart_count=job.restart_count,
        last_reset_reason=job.last_reset_reason,
        progress=None
        if progress is None
        else Progress(
            epoch=progress.epoch,
            step=progress.step,
            samples_per_second=progress.samples_per_second,
            committed_step=job.committed_step,
        ),
        goodput=goodput_of(job.lost_time, job.now, suspended_s),
        last_checkpoint=checkpoint_of(job.last_checkpoint),
        restored=restore_of(job),
        notice_seq=job.notice_seq,
        replicas_clamped=replicas_clamped,
        history=history,
    )


def blacklisted_nodes(entries: Sequence[BlacklistEntry]) -> list[BlacklistedNode]:
    """The blacklisting in force (as the job's state holds it) as the status shows it."""
    return [
        BlacklistedNode(
            node=entry.key,
            until=datetime.datetime.fromtimestamp(entry.until, datetime.UTC),
            strikes=entry.strikes,
        )
        for entry in entries
    ]


def stragglers_of(job: JobSnapshot) -> list[StragglerStatus]:
    """The slow members of the round in force, by rank."""
    found = [
        StragglerStatus(
            pod=worker.hostname,
            rank=job.slots[worker].rank,
            slowdown=straggler.slowdown,
            flagged=straggler.flagged,
        )
        for worker, straggler in job.stragglers.items()
        if worker in job.slots
    ]
    return sorted(found, key=lambda s: s.rank)


def checkpoint_of(report: CheckpointReport | None) -> CheckpointStatus | None:
    """The status's account of a durable checkpoint a worker reported."""
    if report is None:
        return None
    return CheckpointStatus(
        name=report.name,
        epoch=report.epoch,
        step=report.step,
        seconds=round(report.seconds, 3),
        size_bytes=report.size_bytes,
    )


def restore_of(job: JobSnapshot) -> RestoreStatus | None:
    """The latest durable fallback of the job (None: none yet)."""
    restore = job.restore
    checkpoint = None if restore is None else checkpoint_of(restore.checkpoint)
    if restore is None or checkpoint is None:
        return None
    return RestoreStatus(checkpoint=checkpoint, round=restore.round, steps_lost=restore.steps_lost)


def goodput_of(lost_time: LostTime, now: float, suspended_s: float = 0.0) -> Goodput:
    """The status's account of ``lost_time`` at ``now`` (the driver's clock), the job having
    been suspended for ``suspended_s`` (outside the account)."""
    lost = lost_time.lost_seconds(now)
    return Goodput(
        ratio=round(lost_time.goodput(now), 4),
        lost_seconds=LostSeconds(**{cause.value: round(s, 3) for cause, s in lost.items()}),
        last_recovery_seconds=None
        if lost_time.last_recovery_s is None
        else round(lost_time.last_recovery_s, 3),
        suspended_seconds=round(suspended_s, 3),
    )
