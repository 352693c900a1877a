"""An elastic driver with fakes around it, moved step by step by the test: a fake launcher
(records starts and stops, lets the test end processes), fake discovery, the real in-memory
rendezvous (workers are played by rendezvous requests) and a fake clock."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from typing import TypeVar

from elasticjob.driver.blacklist import Blacklist, BlacklistPolicy
from elasticjob.driver.discovery import HostDiscovery, discover_once
from elasticjob.driver.driver import ElasticDriver
from elasticjob.driver.driver_types import DiscoveryError, DriverSettings, WorkerLauncher
from elasticjob.driver.host_manager import HostManager
from elasticjob.rendezvous.jobs import InMemoryJobRendezvous
from elasticjob.rendezvous.rendezvous_types import RendezvousListener
from elasticjob.wire.messages import (
    HeldShards,
    NoticeKind,
    RendezvousRequest,
    RendezvousResponse,
    ScriptExit,
    SlotInfo,
    WorkerId,
)
from tests.support.clock import FakeClock

DEADLINE = 5.0
"""Upper bound on any await of these tests (a hang fails the test instead)."""

A0, A1, B0, C0 = WorkerId("a", 0), WorkerId("a", 1), WorkerId("b", 0), WorkerId("c", 0)

T = TypeVar("T")


async def bounded(awaitable: Awaitable[T]) -> T:
    return await asyncio.wait_for(awaitable, DEADLINE)


class FakeDiscovery(HostDiscovery):
    def __init__(self, hosts: dict[str, int]) -> None:
        self.hosts = dict(hosts)
        self.error: str | None = None
        """Set: discovery fails with this message."""
        self.threads: list[int] = []
        """The thread of each discovery."""

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        self.threads.append(threading.get_ident())
        if self.error is not None:
            raise DiscoveryError(self.error)
        return dict(self.hosts)


class FakeLauncher(WorkerLauncher):
    """Records what the driver starts and stops; the test ends processes with :meth:`end`."""

    def __init__(self, driver: ElasticDriver) -> None:
        self.driver = driver
        self.started: list[WorkerId] = []
        self.planned: dict[WorkerId, SlotInfo] = {}
        """The slot each worker was last started for."""
        self.stopped: list[WorkerId] = []
        self.stopped_all = False
        self.start_fails: set[WorkerId] = set()
        self.changed = asyncio.Event()

    async def start(self, worker: WorkerId, planned: SlotInfo) -> None:
        if worker in self.start_fails:
            raise OSError(f"cannot start {worker}")
        self.started.append(worker)
        self.planned[worker] = planned
        self.changed.set()

    async def stop(self, worker: WorkerId) -> None:
        self.stopped.append(worker)

    async def stop_all(self) -> None:
        self.stopped_all = True

    def end(self, worker: WorkerId, exit_code: int) -> None:
        self.driver.on_worker_exit(worker, exit_code)


class Job:
    """A driver with its fakes, and the moves of the test."""

    def __init__(self, hosts: dict[str, int], settings: DriverSettings) -> None:
        self.clock = FakeClock()
        self.discovery = FakeDiscovery(hosts)
        self.hosts = HostManager(Blacklist[str](BlacklistPolicy(10.0, 40.0), self.clock))
        self.launchers: list[FakeLauncher] = []
        self.rendezvous: InMemoryJobRendezvous | None = None
        self.driver = ElasticDriver(
            self.hosts, self._launcher, self._rendezvous, settings, self.clock
        )

    def _launcher(self, driver: ElasticDriver) -> WorkerLauncher:
        self.launchers.append(FakeLauncher(driver))
        return self.launchers[0]

    def _rendezvous(self, listener: RendezvousListener) -> InMemoryJobRendezvous:
        self.rendezvous = InMemoryJobRendezvous("job", "token", listener)
        return self.rendezvous

    @property
    def launcher(self) -> FakeLauncher:
        return self.launchers[0]

    @property
    def job(self) -> InMemoryJobRendezvous:
        assert self.rendezvous is not None
        return self.rendezvous

    async def discover(self) -> None:
        await bounded(discover_once(self.discovery, self.driver))

    async def step(self) -> None:
        await bounded(self.driver.step())

    async def ask(
        self,
        worker: WorkerId,
        after_round: int = 0,
        *,
        rolled_back: bool = False,
        suspended: bool = False,
        script_exit: ScriptExit | None = None,
        held_shards: HeldShards | None = None,
    ) -> RendezvousResponse:
        """The worker asks for a round newer than ``after_round`` (answered at once);
        ``suspended``: it saved its state for a suspension; ``script_exit``: its script failed
        on its own (restart mode); ``held_shards``: what it holds of a sharded state."""
        request = RendezvousRequest(
            hostname=worker.hostname,
            local_rank=worker.local_rank,
            address="127.0.0.1",
            store_port=29500 + worker.local_rank,
            after_round=after_round,
            wait_seconds=0,
            rolled_back=rolled_back,
            suspended=suspended,
            script_exit=script_exit,
            held_shards=held_shards,
        )
        return await bounded(self.job.rendezvous(request))

    async def start_round_1(self, *workers: WorkerId) -> None:
        """Discover, launch, let ``workers`` register and publish round 1."""
        await self.discover()
        await self.step()
        assert set(self.launcher.started) == set(workers)
        for worker in workers:
            await self.ask(worker)
        await self.step()
        assert self.driver.round == 1 and set(self.driver.slots) == set(workers)

    async def notices(self) -> list[tuple[NoticeKind, tuple[str, ...]]]:
        """The notices posted so far."""
        response = await bounded(self.job.notices(0, 0))
        return [(n.kind, n.hosts) for n in response.notices]


def settings(**changes: float | int | None) -> DriverSettings:
    base: dict[str, float | int | None] = {"min_np": 1, "start_timeout_s": 60.0}
    base.update(changes)
    return DriverSettings(**base)  # type: ignore[arg-type]


class RecordingObserver:
    def __init__(self) -> None:
        self.formed: list[float] = []
        self.recoveries: list[float] = []
        self.commits: list[float] = []
        self.checkpoints: list[float] = []

    def round_formed(self, seconds: float) -> None:
        self.formed.append(seconds)

    def recovered(self, seconds: float) -> None:
        self.recoveries.append(seconds)

    def committed(self, seconds: float) -> None:
        self.commits.append(seconds)

    def checkpointed(self, seconds: float) -> None:
        self.checkpoints.append(seconds)
