"""What the operator's metrics read of its job controllers and their drivers, as plain
values a test sets."""

from __future__ import annotations

from dataclasses import dataclass, field

from elasticjob.driver.goodput import LostTime
from elasticjob.driver.registry import WorkerRegistry
from elasticjob.operator.api import Phase
from elasticjob.wire import ProgressRequest, WorkerId
from tests.support.clock import FakeClock


@dataclass
class StubJournal:
    lost_time: LostTime


@dataclass
class StubDriver:
    """What the metrics read of a driver."""

    clock: FakeClock = field(default_factory=lambda: FakeClock(100.0))
    slots: dict[WorkerId, object] = field(default_factory=dict)
    progress: ProgressRequest | None = None
    lost_time: LostTime = field(default_factory=lambda: LostTime.start(0.0))
    registry: WorkerRegistry = field(default_factory=WorkerRegistry)

    @property
    def journal(self) -> StubJournal:
        return StubJournal(self.lost_time)


@dataclass
class StubController:
    job_id: str
    phase: Phase = Phase.RUNNING
    pods_created: int = 0
    pods_deleted: int = 0
    driver: StubDriver | None = None
