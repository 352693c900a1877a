"""What the operator's metrics read of its job controllers: each job's snapshot, as plain
values a test sets."""

from __future__ import annotations

from dataclasses import dataclass

from elasticjob.driver.driver_types import DriverPhase
from elasticjob.driver.goodput import LostTime
from elasticjob.driver.job_snapshot import JobSnapshot
from elasticjob.driver.stragglers import Straggler
from elasticjob.operator.api import Phase
from elasticjob.wire.messages import ProgressRequest, SlotInfo, WorkerId


def snapshot(
    *,
    now: float = 100.0,
    slots: dict[WorkerId, SlotInfo] | None = None,
    progress: ProgressRequest | None = None,
    lost_time: LostTime | None = None,
    reset_count: int = 0,
    stragglers: dict[WorkerId, Straggler] | None = None,
    stragglers_found: int = 0,
) -> JobSnapshot:
    """What the metrics read of a job: its driver's snapshot."""
    return JobSnapshot(
        now=now,
        phase=DriverPhase.RUNNING,
        result=None,
        recovering=False,
        round=1,
        slots=slots or {},
        reset_count=reset_count,
        restart_count=0,
        last_reset_reason=None,
        progress=progress,
        committed_step=None,
        lost_time=lost_time or LostTime.start(0.0),
        last_checkpoint=None,
        restore=None,
        notice_seq=0,
        stragglers=stragglers or {},
        stragglers_found=stragglers_found,
    )


@dataclass
class StubController:
    job_id: str
    phase: Phase = Phase.RUNNING
    pods_created: int = 0
    pods_deleted: int = 0
    suspensions: int = 0
    job: JobSnapshot | None = None

    def snapshot(self) -> JobSnapshot | None:
        return self.job
