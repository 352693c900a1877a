"""A job's rendezvous as the tests drive it: a listener that records what the job tells its
driver, workers, their requests and the slots of a round."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from elasticjob.rendezvous.rendezvous_types import ProbeReport
from elasticjob.wire.messages import (
    ExitAnswer,
    HeldShards,
    ProgressRequest,
    RendezvousRequest,
    ResultRequest,
    ScriptExit,
    SlotInfo,
    StepPace,
    WorkerId,
)

DEADLINE = 5.0
"""Upper bound on any await that must complete (a hang fails the test instead)."""


class RecordingListener:
    """Records what the job tells its driver; ``ready_event`` is set on every READY."""

    def __init__(self) -> None:
        self.ready: list[tuple[WorkerId, int]] = []
        self.rolled_back: list[tuple[WorkerId, int]] = []
        self.results: list[ResultRequest] = []
        self.exits: list[tuple[WorkerId, int]] = []
        self.exit_answer = ExitAnswer(restart=False)
        """What a pod's report of a slot's end is answered."""
        self.progress: list[ProgressRequest] = []
        self.heartbeats: list[WorkerId] = []
        self.held_shards: list[tuple[WorkerId, HeldShards | None]] = []
        self.reports: list[tuple[WorkerId, ProbeReport | None]] = []
        self.paces: list[tuple[WorkerId, StepPace | None]] = []
        self.incompatible: list[str] = []
        self.ready_event = asyncio.Event()
        self.dismissed: set[WorkerId] = set()
        """The workers the driver dismissed (the job asks, :meth:`is_dismissed`)."""

    def is_dismissed(self, worker: WorkerId) -> bool:
        return worker in self.dismissed

    def on_worker_ready(
        self,
        worker: WorkerId,
        after_round: int,
        *,
        rolled_back: bool,
        script_exit: ScriptExit | None = None,
        suspended: bool = False,
        held_shards: HeldShards | None = None,
    ) -> None:
        self.ready.append((worker, after_round))
        if rolled_back:
            self.rolled_back.append((worker, after_round))
        self.ready_event.set()

    def on_worker_exit_seen(self, worker: WorkerId, exit_code: int) -> ExitAnswer:
        self.exits.append((worker, exit_code))
        return self.exit_answer

    def on_worker_result(self, request: ResultRequest) -> None:
        self.results.append(request)

    def on_progress(self, progress: ProgressRequest) -> None:
        self.progress.append(progress)

    def on_incompatible_worker(self, message: str) -> None:
        self.incompatible.append(message)

    def on_worker_heartbeat(
        self,
        worker: WorkerId,
        report: ProbeReport | None,
        pace: StepPace | None,
        held_shards: HeldShards | None = None,
    ) -> None:
        self.heartbeats.append(worker)
        self.reports.append((worker, report))
        self.paces.append((worker, pace))
        self.held_shards.append((worker, held_shards))


W0 = WorkerId("host-a", 0)
W1 = WorkerId("host-b", 0)
W2 = WorkerId("host-a", 1)


def request(
    worker: WorkerId,
    *,
    after_round: int = 0,
    wait: float = 0.0,
    port: int = 29500,
    rolled_back: bool = False,
) -> RendezvousRequest:
    return RendezvousRequest(
        hostname=worker.hostname,
        local_rank=worker.local_rank,
        address=f"addr-{worker.hostname}",
        store_port=port,
        after_round=after_round,
        wait_seconds=wait,
        rolled_back=rolled_back,
    )


def slots_for(workers: Sequence[WorkerId]) -> dict[WorkerId, SlotInfo]:
    """Slots giving ``workers`` ranks in list order."""
    hosts = list(dict.fromkeys(w.hostname for w in workers))
    return {
        w: SlotInfo(
            hostname=w.hostname,
            rank=rank,
            local_rank=w.local_rank,
            cross_rank=hosts.index(w.hostname),
            size=len(workers),
            local_size=sum(1 for other in workers if other.hostname == w.hostname),
            cross_size=len(hosts),
        )
        for rank, w in enumerate(workers)
    }


def slot_of(worker: WorkerId) -> SlotInfo:
    """The slot of ``worker`` alone in a round."""
    return slots_for([worker])[worker]
