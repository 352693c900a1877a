"""The elastic driver of one job: turns discovery, worker reports and process exits into
rounds published on the job's rendezvous.

Lifecycle (``Phase``): STARTING (launch the first workers, wait until they register) ->
RUNNING (a round is in force; host changes and failures are watched) -> FORMING (every
counted member reached the barrier; launch and wait for the next round's members, then
publish it) -> RUNNING ... -> FINISHED.

- Scale-out: workers for new hosts are launched while the round keeps running; only once
  every newcomer has registered is HOSTS_ADDED posted, so survivors pause only for the
  group re-formation, not for process start-up.
- Scale-in: the leaving hosts are announced (HOSTS_REMOVED); their workers reach the barrier
  with everyone else and are then told they are removed (they exit 0, not a failure).
- Failure: ROUND_FAILED is posted at once so survivors abort their group instead of waiting
  for a collective timeout; once all members have reported, the failed hosts are
  blacklisted and the next round is formed from the survivors, rank 0 on the oldest host.

What to do at the barrier is decided by :func:`~elasticjob.driver.registry.decide`, a pure
function; this module only carries its decisions out.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from elasticjob.driver.api import (
    Action,
    CapacityAction,
    Clock,
    DiscoveryError,
    DriverError,
    WorkerLauncher,
)
from elasticjob.driver.hosts import HostManager
from elasticjob.driver.liveness import hung_workers
from elasticjob.driver.registry import WorkerRegistry, decide, decide_capacity
from elasticjob.driver.slots import NotEnoughSlotsError, assign_slots, check_continuity
from elasticjob.rendezvous.api import JobRendezvous, RendezvousListener
from elasticjob.wire import (
    NoticeKind,
    ProgressRequest,
    ResultRequest,
    SlotInfo,
    WorkerId,
    WorkerState,
)

logger = logging.getLogger(__name__)


class Phase(enum.Enum):
    STARTING = "starting"
    RUNNING = "running"
    FORMING = "forming"
    FINISHED = "finished"


@dataclass(frozen=True)
class DriverSettings:
    min_np: int = 1
    max_np: int | None = None
    reset_limit: int | None = None
    elastic_timeout_s: float = 600.0
    """How long to wait while fewer than ``min_np`` slots are available."""
    start_timeout_s: float = 120.0
    """How long a newly launched worker may take to register before it counts as failed."""
    discovery_interval_s: float = 1.0
    removal_grace_s: float = 30.0
    """How long a removed worker may take to exit before it is stopped."""
    heartbeat_timeout_s: float | None = None
    """Evict a worker process that sent no heartbeat for this long (None: never)."""

    def __post_init__(self) -> None:
        if self.min_np < 1:
            raise ValueError(f"min_np must be >= 1, got {self.min_np}")
        if self.max_np is not None and self.max_np < self.min_np:
            raise ValueError(f"max_np ({self.max_np}) must be >= min_np ({self.min_np})")


@dataclass(frozen=True)
class JobResult:
    success: bool
    message: str
    rounds: int
    resets: int


@dataclass
class _Worker:
    """What the driver knows about one worker process it launched."""

    started_at: float
    running: bool = True
    ready_after: int = -1
    """The worker waits for a round newer than this (-1: it has not registered)."""
    last_round: int = 0
    """The last round it was a member of (0: none yet)."""
    message: str = ""
    last_heartbeat: float | None = None
    """When its process last beat (None: not yet, or it is being evicted)."""
    ending: bool = False
    """It reported how its process ends: its exit is awaited, not its heartbeat."""


class ElasticDriver(RendezvousListener):
    """Runs one elastic job (see the module docstring)."""

    def __init__(
        self,
        hosts: HostManager,
        launcher_factory: Callable[[ElasticDriver], WorkerLauncher],
        rendezvous_factory: Callable[[RendezvousListener], JobRendezvous],
        settings: DriverSettings,
        clock: Clock,
    ) -> None:
        self.settings = settings
        self.hosts = hosts
        self._clock = clock
        self.rendezvous = rendezvous_factory(self)
        self.launcher = launcher_factory(self)
        self.registry = WorkerRegistry()
        self.phase = Phase.STARTING
        self.progress: ProgressRequest | None = None
        self._workers: dict[WorkerId, _Worker] = {}
        self._leaving: set[WorkerId] = set()
        self._removed: set[WorkerId] = set()
        self._newcomers_announced = False
        self._round_failed = False
        self._capacity_wait_since: float | None = None
        self._wake = asyncio.Event()
        self._result: JobResult | None = None
        self._reapers: list[asyncio.Task[None]] = []
        self.last_reset_reason: str | None = None
        self.recoveries = 0
        self.recovery_seconds_sum = 0.0
        self._failed_at: float | None = None

    # ---- queries -----------------------------------------------------------------------

    @property
    def round(self) -> int:
        return self.rendezvous.current_round

    @property
    def slots(self) -> Mapping[WorkerId, SlotInfo]:
        return self.rendezvous.current_slots

    @property
    def result(self) -> JobResult | None:
        """How the job ended, once it has."""
        return self._result

    @property
    def recovering(self) -> bool:
        """Whether the round being formed follows a failure."""
        return self._round_failed

    def rank_of(self, worker: WorkerId) -> int | None:
        slot = self.slots.get(worker)
        return slot.rank if slot is not None and worker not in self._removed else None

    def adopt(self, round_number: int, slots: Mapping[WorkerId, SlotInfo], notice_seq: int) -> None:
        """Resume supervising a round that runs already (the driver's process restarted):
        its members are taken as running and not at the barrier."""
        self.rendezvous.adopt(round_number, slots, notice_seq)
        now = self._clock()
        for worker in slots:
            self._workers[worker] = _Worker(
                started_at=now, ready_after=round_number - 1, last_round=round_number
            )
        self.registry.start_round(round_number, frozenset(slots))
        self.phase = Phase.RUNNING
        logger.info("adopted round %d with %d workers", round_number, len(slots))

    # ---- events (listener and launcher callbacks; all on the event loop) -----------------

    def on_worker_ready(self, worker: WorkerId, after_round: int) -> None:
        state = self._workers.get(worker)
        if state is None:
            logger.warning("ignoring registration of unknown worker %s", worker)
            return
        state.ready_after = max(state.ready_after, after_round)
        if worker in self.slots and after_round >= self.round:
            self.registry.record(worker, WorkerState.READY)
        self._wake.set()

    def on_worker_result(self, request: ResultRequest) -> None:
        worker = WorkerId(request.hostname, request.local_rank)
        state = self._workers.get(worker)
        if state is not None:
            state.ending = True
            state.message = request.message or state.message
        # The process exit (reported by the launcher) is what counts; nothing else to do.

    def on_progress(self, progress: ProgressRequest) -> None:
        self.progress = progress

    def on_worker_heartbeat(self, worker: WorkerId) -> None:
        state = self._workers.get(worker)
        if state is not None and state.running:
            state.last_heartbeat = self._clock()

    def on_worker_exit(self, worker: WorkerId, exit_code: int) -> None:
        """Called by the launcher when a worker process ends."""
        state = self._workers.get(worker)
        if state is None or not state.running:
            return
        state.running = False
        if worker in self._removed or worker in self._leaving:
            logger.info("worker %s left the job (exit code %d)", worker, exit_code)
        elif self.phase is Phase.FINISHED:
            pass
        elif worker in self.slots and self.phase is Phase.RUNNING:
            if exit_code == 0:
                self.registry.record(worker, WorkerState.SUCCESS)
            else:
                logger.warning(
                    "worker %s of round %d failed (exit code %d)", worker, self.round, exit_code
                )
                self.registry.record(worker, WorkerState.FAILURE)
                if not self._round_failed:
                    self._round_failed = True
                    self._failed_at = self._clock()
                    self.rendezvous.post_notice(NoticeKind.ROUND_FAILED, (worker.hostname,))
        elif exit_code != 0:
            logger.warning("worker %s failed between rounds (exit code %d)", worker, exit_code)
            self._blacklist({worker.hostname})
        self._wake.set()

    # ---- main loop -------------------------------------------------------------------------

    async def run(self) -> JobResult:
        """Run the job to completion and return its result."""
        discovery = asyncio.create_task(self._discover_forever(), name="discovery")
        try:
            await self._discover_once()
            while self._result is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=1.0)
                self._wake.clear()
                try:
                    await self._step()
                except DriverError as exc:
                    self._finish(False, str(exc))
        finally:
            for task in (discovery, *self._reapers):
                task.cancel()
            await asyncio.gather(discovery, *self._reapers, return_exceptions=True)
            self.phase = Phase.FINISHED
            self.rendezvous.finish(self._result.message if self._result else "driver stopped")
            await self.launcher.stop_all()
        assert self._result is not None
        return self._result

    async def _discover_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.discovery_interval_s)
            await self._discover_once()

    async def _discover_once(self) -> None:
        try:
            update = await asyncio.to_thread(self.hosts.update_available_hosts)
        except DiscoveryError as exc:
            logger.warning("host discovery failed: %s", exc)
            return
        if not update:
            return
        logger.info("hosts added: %s; removed: %s", list(update.added), list(update.removed))
        if self.phase is Phase.RUNNING and update.removed:
            # Members whose process has ended already reported how; they do not "leave".
            leaving = {
                w for w in self.slots if w.hostname in update.removed and self._workers[w].running
            } - self._leaving
            if leaving:
                self._leaving |= leaving
                self.registry.mark_removed(leaving)
                self.rendezvous.post_notice(
                    NoticeKind.HOSTS_REMOVED, sorted({w.hostname for w in leaving})
                )
        self._wake.set()

    async def _step(self) -> None:
        await self._evict_hung()
        if self.phase is Phase.STARTING or self.phase is Phase.FORMING:
            await self._form_round()
        elif self.phase is Phase.RUNNING:
            await self._check_round()

    async def _check_round(self) -> None:
        decision = decide(
            self.registry.records(),
            resets=self.registry.reset_count,
            reset_limit=self.settings.reset_limit,
        )
        if decision.action is Action.WAIT:
            await self._prepare_newcomers()
        elif decision.action is Action.SUCCEED:
            self._finish(True, decision.reason or "training finished")
        elif decision.action is Action.FAIL:
            self._finish(False, self._with_worker_messages(decision.reason))
        else:
            self._blacklist(decision.blacklist)
            self.registry.count_reset()
            self.last_reset_reason = decision.reason or "hosts changed"
            self.phase = Phase.FORMING
            self._capacity_wait_since = None
            await self._form_round()

    # ---- forming rounds ----------------------------------------------------------------

    def _plan(self) -> dict[WorkerId, SlotInfo] | None:
        """The next round's slots from the usable hosts, or None while capacity is short."""
        hosts = self.hosts.current_hosts
        try:
            slots = assign_slots(hosts, min_np=self.settings.min_np, max_np=self.settings.max_np)
        except NotEnoughSlotsError as exc:
            if self.hosts.all_discovered_blacklisted():
                raise DriverError(
                    f"every discovered host is blacklisted: {sorted(self.hosts.blacklist.active())}"
                ) from exc
            now = self._clock()
            action = decide_capacity(
                available_slots=sum(n for _, n in hosts),
                min_np=self.settings.min_np,
                waiting_since=self._capacity_wait_since,
                now=now,
                elastic_timeout_s=self.settings.elastic_timeout_s,
            )
            if action is CapacityAction.TIMEOUT:
                raise DriverError(
                    f"elastic timeout: {exc} for {self.settings.elastic_timeout_s:.0f} s"
                ) from exc
            if self._capacity_wait_since is None:
                logger.warning("%s; waiting up to %.0f s", exc, self.settings.elastic_timeout_s)
                self._capacity_wait_since = now
            return None
        self._capacity_wait_since = None
        return slots

    async def _form_round(self) -> None:
        plan = self._plan()
        if plan is None:
            return
        previous = {w.hostname for w in self.slots if w not in self._leaving}
        check_continuity(previous, [w.hostname for w in plan])
        await self._launch_missing(plan)
        await self._expire_slow_starters()
        if not all(self._at_barrier(w) for w in plan):
            return
        newcomers = [w for w in plan if self._workers[w].last_round == 0]
        sync = self.round == 0 or self._round_failed or bool(newcomers)
        next_round = self.round + 1
        outgoing = [w for w, s in self._workers.items() if w not in plan and s.running]
        self.rendezvous.publish_round(next_round, plan, sync=sync)
        self._removed |= set(outgoing)
        self.rendezvous.remove_workers(outgoing)
        if outgoing:
            self._reapers.append(asyncio.create_task(self._reap(outgoing)))
        for worker in plan:
            self._workers[worker].last_round = next_round
        self.registry.start_round(next_round, frozenset(plan))
        self._leaving.clear()
        if self._failed_at is not None:
            self.recoveries += 1
            self.recovery_seconds_sum += self._clock() - self._failed_at
            self._failed_at = None
        self._round_failed = False
        self._newcomers_announced = False
        self.phase = Phase.RUNNING
        logger.info(
            "round %d: %d workers on %s (sync=%s, newcomers=%d, removed=%d)",
            next_round,
            len(plan),
            ",".join(dict.fromkeys(w.hostname for w in plan)),
            sync,
            len(newcomers),
            len(outgoing),
        )

    async def _reap(self, workers: list[WorkerId]) -> None:
        """Stop removed workers that have not exited after the grace period."""
        await asyncio.sleep(self.settings.removal_grace_s)
        for worker in workers:
            if self._workers[worker].running and worker in self._removed:
                logger.warning("removed worker %s did not exit; stopping it", worker)
                await self.launcher.stop(worker)

    def _at_barrier(self, worker: WorkerId) -> bool:
        state = self._workers.get(worker)
        return state is not None and state.running and state.ready_after >= state.last_round

    async def _launch_missing(self, plan: Mapping[WorkerId, SlotInfo]) -> None:
        for worker in plan:
            state = self._workers.get(worker)
            if state is not None and state.running:
                continue
            self._workers[worker] = _Worker(started_at=self._clock())
            self._removed.discard(worker)
            self.rendezvous.readmit([worker])
            try:
                await self.launcher.start(worker)
            except OSError as exc:
                logger.error("could not start worker %s: %s", worker, exc)
                self.on_worker_exit(worker, 127)

    async def _expire_slow_starters(self) -> None:
        now = self._clock()
        for worker, state in list(self._workers.items()):
            if (
                state.running
                and state.last_round == 0
                and state.ready_after < 0
                and (now - state.started_at > self.settings.start_timeout_s)
            ):
                logger.error(
                    "worker %s did not register within %.0f s",
                    worker,
                    self.settings.start_timeout_s,
                )
                self._removed.add(worker)
                await self.launcher.stop(worker)
                self._blacklist({worker.hostname})

    async def _evict_hung(self) -> None:
        """Kill the worker processes that stopped beating (see ``liveness.py``); each exit
        is then handled as a failure."""
        beats = {
            w: s.last_heartbeat
            for w, s in self._workers.items()
            if s.running and not s.ending and w not in self._removed
        }
        now = self._clock()
        for worker in sorted(
            hung_workers(beats, timeout_s=self.settings.heartbeat_timeout_s, now=now)
        ):
            state = self._workers[worker]
            logger.error(
                "worker %s sent no heartbeat for %.1f s: evicting it",
                worker,
                now - (state.last_heartbeat or now),
            )
            state.last_heartbeat = None
            await self.launcher.kill(worker)

    async def _prepare_newcomers(self) -> None:
        """While a round runs: launch workers for newly usable hosts and announce them once
        they have all registered."""
        if self._leaving or self._newcomers_announced:
            return
        plan = self._plan()
        if plan is None:
            return
        newcomers = [w for w in plan if w not in self.slots]
        if not newcomers:
            return
        await self._launch_missing(plan)
        await self._expire_slow_starters()
        if all(self._at_barrier(w) for w in newcomers):
            self._newcomers_announced = True
            self.rendezvous.post_notice(
                NoticeKind.HOSTS_ADDED, sorted({w.hostname for w in newcomers})
            )

    # ---- endings -----------------------------------------------------------------------

    def _blacklist(self, hosts: set[str] | frozenset[str]) -> None:
        for host in sorted(hosts):
            until = self.hosts.exclude(host)
            logger.warning("blacklisted host %s for %.0f s", host, until - self._clock())

    def _with_worker_messages(self, reason: str) -> str:
        messages = [
            f"{w}: {s.message.strip().splitlines()[-1]}"
            for w, s in self._workers.items()
            if s.message.strip()
        ]
        return reason + ("\n" + "\n".join(messages) if messages else "")

    def _finish(self, success: bool, message: str) -> None:
        if self._result is None:
            self._result = JobResult(success, message, self.round, self.registry.reset_count)
            (logger.info if success else logger.error)(
                "job %s: %s", "succeeded" if success else "failed", message
            )
        self._wake.set()
