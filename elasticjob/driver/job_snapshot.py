"""One read model of a job: what its driver knows at one moment, as a value.

Whoever shows a job (the operator's status and metrics, the local launcher's summary) reads
:meth:`ElasticDriver.snapshot() <elasticjob.driver.driver.ElasticDriver.snapshot>` instead of
reaching into the driver's registry, journal or rendezvous.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from elasticjob.driver.driver_types import DriverPhase, JobResult
from elasticjob.driver.goodput import LostTime
from elasticjob.driver.journal_events import Restore
from elasticjob.driver.stragglers import Straggler
from elasticjob.wire.messages import CheckpointReport, ProgressRequest, SlotInfo, WorkerId


@dataclass(frozen=True)
class JobSnapshot:
    """What a job's driver knows at ``now`` (its clock)."""

    now: float
    phase: DriverPhase
    result: JobResult | None
    """How the job ended, once it has."""
    recovering: bool
    """The round being formed follows a failure (or a rollback)."""
    round: int
    """The round in force (0 before the first)."""
    slots: Mapping[WorkerId, SlotInfo]
    """The members of the round in force."""
    reset_count: int
    restart_count: int
    """Resets that followed a failure (what ``DriverSettings.restart_limit`` counts)."""
    last_reset_reason: str | None
    progress: ProgressRequest | None
    """What rank 0 last reported."""
    committed_step: int | None
    """The runtime's step count at rank 0's newest commit."""
    lost_time: LostTime
    """The goodput account (``lost_time.goodput(now)``)."""
    last_checkpoint: CheckpointReport | None
    restore: Restore | None
    """The latest durable fallback."""
    notice_seq: int
    """The sequence number of the latest notice."""
    stragglers: Mapping[WorkerId, Straggler] = field(default_factory=dict)
    """The members of the round in force found slow (flagged or not yet)."""
    stragglers_found: int = 0
    """Members flagged as stragglers so far (by this driver)."""

    @property
    def world_size(self) -> int:
        """How many workers the round in force has."""
        return len(self.slots)

    @property
    def goodput(self) -> float:
        """The share of the job's wall time spent training (see ``goodput.py``)."""
        return self.lost_time.goodput(self.now)

    def ranks_by_host(self) -> dict[str, list[int]]:
        """The ranks of the round in force on each host (sorted)."""
        ranks: dict[str, list[int]] = {}
        for worker, slot in self.slots.items():
            ranks.setdefault(worker.hostname, []).append(slot.rank)
        return {host: sorted(found) for host, found in ranks.items()}
