"""The elastic driver of one job: carries out what ``decisions.py`` decides, against the
job's worker processes (``workers.py``, through a :class:`WorkerLauncher`) and its rendezvous.

Lifecycle (:class:`Phase`): STARTING -> RUNNING (a round is in force) -> FORMING (the round
ended at the barrier; the next one is launched, awaited and published) -> RUNNING ... ->
FINISHED. Newcomers are launched while a round runs and announced (HOSTS_ADDED) only once all
have registered; members on vanished hosts *leave* (HOSTS_REMOVED), reach the barrier and are
then *dismissed*; when a member fails, or rolls back after a collective failed on it alone,
ROUND_FAILED is posted at once and the next round is synced from rank 0. The loop can be
driven step by step (:meth:`ElasticDriver.discover`, :meth:`ElasticDriver.step`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from elasticjob.driver.api import (
    Clock,
    Departure,
    DiscoveryError,
    DriverError,
    DriverSettings,
    JobResult,
    Phase,
    WorkerLauncher,
)
from elasticjob.driver.decisions import (
    Action,
    AwaitBarrier,
    AwaitCapacity,
    EndJob,
    ExitVerdict,
    FormRound,
    Publish,
    ReadyVerdict,
    RoundPlan,
    ScaleOutAction,
    classify_exit,
    classify_ready,
    decide_discovery_failure,
    decide_formation,
    decide_round,
    decide_scale_out,
    leaving_members,
    plan_round,
)
from elasticjob.driver.hosts import Capacity, HostManager
from elasticjob.driver.journal import JobJournal
from elasticjob.driver.liveness import Reachability
from elasticjob.driver.loop_lag import LoopLagWatch
from elasticjob.driver.registry import WorkerRegistry
from elasticjob.driver.timeouts import overdue_dismissals, overdue_endings, slow_starters
from elasticjob.driver.workers import NOT_JOINED_HINT, WorkerProcesses
from elasticjob.rendezvous.api import JobRendezvous, ProbeReport, RendezvousListener
from elasticjob.wire.messages import (
    NoticeKind,
    ProgressRequest,
    ResultRequest,
    SlotInfo,
    WorkerId,
    WorkerState,
)

logger = logging.getLogger(__name__)

__all__ = ["DriverSettings", "ElasticDriver", "JobResult", "Phase"]

TICK_S: Final = 1.0
"""The loop runs a step at least this often, even when nothing wakes it (timeouts)."""


class ElasticDriver(RendezvousListener):
    """Runs one elastic job (see the module docstring)."""

    def __init__(
        self,
        hosts: HostManager,
        launcher_factory: Callable[[ElasticDriver], WorkerLauncher],
        rendezvous_factory: Callable[[RendezvousListener], JobRendezvous],
        settings: DriverSettings,
        clock: Clock,
        *,
        loop_lag: LoopLagWatch | None = None,
    ) -> None:
        """``loop_lag``: the watch of the event loop shared by the drivers that run on it
        (by default the driver watches its own)."""
        self.settings = settings
        self.hosts = hosts
        self._clock = clock
        self.rendezvous = rendezvous_factory(self)
        self.launcher = launcher_factory(self)
        self.registry = WorkerRegistry()
        self.phase = Phase.STARTING
        self.progress: ProgressRequest | None = None
        self._workers = WorkerProcesses(self.launcher, self.rendezvous, clock)
        self.reachability = Reachability()
        """Whether the workers can reach this driver (its front end keeps it up to date)."""
        self._loop_lag = loop_lag or LoopLagWatch(clock)
        self._newcomers_announced = False
        self._recovering = False
        self._from_checkpoint = False
        """The round being formed starts from the newest checkpoint (no survivor)."""
        self._capacity_wait_since: float | None = None
        self._scale_out_plan: tuple[Capacity, RoundPlan] | None = None
        """The capacity a running round's scale-out was last planned for, and the plan."""
        self._wake = asyncio.Event()
        self._result: JobResult | None = None
        self.last_reset_reason: str | None = None
        self.journal = JobJournal(clock)
        """What happened to the job: goodput, its record, its observer (``journal.py``)."""

    # ---- queries -----------------------------------------------------------------------

    @property
    def clock(self) -> Clock:
        """The driver's clock (monotonic seconds; the journal's times are in it)."""
        return self._clock

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
        """Whether the round being formed follows a failure (or a rollback)."""
        return self._recovering

    def rank_of(self, worker: WorkerId) -> int | None:
        """The worker's rank in the round in force (None: it has none, left or failed)."""
        slot = self.slots.get(worker)
        return slot.rank if slot is not None and not self._workers.gone(worker) else None

    def resume_resets(self, reset_count: int, last_reset_reason: str | None) -> None:
        """Carry on the job's reset history after a driver restart: ``reset_limit`` counts
        the resets before it too, and the count never goes back."""
        self.registry.reset_count = max(self.registry.reset_count, reset_count)
        self.last_reset_reason = self.last_reset_reason or last_reset_reason

    def adopt(self, round_number: int, slots: Mapping[WorkerId, SlotInfo], notice_seq: int) -> None:
        """Resume supervising a running round (the driver restarted): its members are taken
        as running and not at the barrier, and have the reach grace to find this driver
        (see ``liveness.Reachability``)."""
        self.rendezvous.adopt(round_number, slots, notice_seq)
        self._workers.adopt(slots, round_number)
        if self.reachability.since is not None:
            self.reachability.since = max(self.reachability.since, self._clock())
        self.registry.start_round(round_number, frozenset(slots))
        self.phase = Phase.RUNNING
        self.journal.adopted(round_number)
        logger.info("adopted round %d with %d workers", round_number, len(slots))

    # ---- events (listener and launcher callbacks; all on the event loop) -----------------

    def on_worker_ready(self, worker: WorkerId, after_round: int, *, rolled_back: bool) -> None:
        record = self._workers.get(worker)
        verdict = classify_ready(
            self.phase,
            known=record is not None,
            member=worker in self.slots,
            after_round=after_round,
            current_round=self.round,
            rolled_back=rolled_back,
        )
        if verdict is ReadyVerdict.UNKNOWN or record is None:
            logger.warning("ignoring registration of unknown worker %s", worker)
            return
        record.waiting_after = max(record.waiting_after or 0, after_round)
        if verdict in (ReadyVerdict.READY, ReadyVerdict.ROLLED_BACK):
            self.registry.record(worker, WorkerState.READY)
        if verdict is ReadyVerdict.ROLLED_BACK:
            # After a failure every survivor rolls back: one line per job, not per worker.
            (logger.debug if self._recovering else logger.warning)(
                "worker %s rolled back after a collective failed", worker
            )
            self.registry.mark_rolled_back(worker)
            self.journal.collective_failed(worker.hostname, self.round, len(self.slots))
            self._fail_round(worker.hostname)
        self._wake.set()

    def on_worker_result(self, request: ResultRequest) -> None:
        record = self._workers.get(WorkerId(request.hostname, request.local_rank))
        if record is not None:
            record.ending_since = self._clock()
            record.reported = request.state
            record.heard_from = True
            record.message = request.message or record.message  # its exit is what counts

    def on_progress(self, progress: ProgressRequest) -> None:
        self.progress = progress
        self.journal.progress(progress, self.round, len(self.slots))

    def on_worker_heartbeat(self, worker: WorkerId, report: ProbeReport | None) -> None:
        if self._workers.beat(worker, report):
            self._wake.set()  # a member reports a peer it cannot reach: judge at once

    def on_worker_exit(self, worker: WorkerId, exit_code: int) -> None:
        """Called by the launcher when a worker process ends."""
        record = self._workers.get(worker)
        if record is None or not record.running:
            return
        record.running = False
        verdict = classify_exit(
            self.phase,
            member=worker in self.slots,
            departure=record.departure,
            exit_code=exit_code,
            registered=record.registered,
            stopped_after_success=record.stop_requested and record.reported is WorkerState.SUCCESS,
        )
        if verdict is ExitVerdict.DEPARTED:
            logger.info("worker %s left the job (exit code %d)", worker, exit_code)
        elif verdict is ExitVerdict.ALREADY_FAILED:
            logger.info("failed worker %s ended (exit code %d)", worker, exit_code)
        elif verdict is ExitVerdict.SUCCEEDED:
            self.registry.record(worker, WorkerState.SUCCESS)
        elif verdict is ExitVerdict.FAILED:
            logger.warning(
                "worker %s of round %d failed (exit code %d)", worker, self.round, exit_code
            )
            record.departure = Departure.FAILED
            self.registry.record(worker, WorkerState.FAILURE)
            self.journal.failed(worker.hostname, self.round, len(self.slots))
            self._fail_round(worker.hostname)
        elif verdict is ExitVerdict.FAILED_OUTSIDE_ROUND:
            logger.warning("worker %s failed between rounds (exit code %d)", worker, exit_code)
            record.fail_outside_round(exit_code)
            self._blacklist({worker.hostname})
        elif verdict is ExitVerdict.ENDED_WITHOUT_JOINING:
            record.departure = Departure.FAILED
            self._finish(
                False,
                f"worker {worker} exited with status 0 before it joined the job: its command "
                "never asked for a round, and a fresh process would do the same "
                f"({NOT_JOINED_HINT})",
            )
        self._wake.set()

    def _fail_round(self, host: str) -> None:
        """Tell the members once that the round is broken; the next round syncs state."""
        if not self._recovering:
            self._recovering = True
            self.rendezvous.post_notice(NoticeKind.ROUND_FAILED, (host,))

    # ---- main loop -------------------------------------------------------------------------

    async def run(self) -> JobResult:
        """Run the job to completion and return its result."""
        discovery = asyncio.create_task(self._discover_forever(), name="discovery")
        try:
            with self._loop_lag.subscribed(self.reachability):
                await self.discover()
                while self._result is None:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), timeout=TICK_S)
                    await self.step()
        finally:
            discovery.cancel()
            await asyncio.gather(discovery, return_exceptions=True)
            self.phase = Phase.FINISHED
            self.rendezvous.finish(self._result.message if self._result else "driver stopped")
            await self.launcher.stop_all()
        assert self._result is not None
        return self._result

    async def _discover_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.discovery_interval_s)
            await self.discover()

    async def discover(self) -> None:
        """Run host discovery once and act on what changed (members on vanished hosts
        leave)."""
        try:
            if self.hosts.discovery_blocks:
                update = await asyncio.to_thread(self.hosts.update_available_hosts)
            else:
                update = self.hosts.update_available_hosts()
        except DiscoveryError as exc:
            logger.warning("host discovery failed: %s", exc)
            if end := decide_discovery_failure(str(exc), discovered_before=self.hosts.discovered):
                self._finish(False, end.reason)
            return
        if not update:
            return
        logger.info("hosts added: %s; removed: %s", list(update.added), list(update.removed))
        leaving = leaving_members(self.phase, update.removed, self.slots, self._workers)
        if leaving:
            for worker in leaving:
                self._workers[worker].departure = Departure.LEAVING
            self.registry.mark_leaving(leaving)
            self.rendezvous.post_notice(
                NoticeKind.HOSTS_REMOVED, sorted({w.hostname for w in leaving})
            )
        self._wake.set()

    async def step(self) -> None:
        """One pass of the loop: act on everything that happened since the last one (nothing
        once the job has its result)."""
        self._wake.clear()
        if self._result is not None:
            return
        try:
            timeout = self.settings.heartbeat_timeout_s
            counts_from = self.reachability.silence_counts_from()
            await self._workers.evict_unanswering(timeout, self.slots, self.round, counts_from)
            await self._stop_overdue(timeout, counts_from)
            if self.phase is Phase.STARTING or self.phase is Phase.FORMING:
                await self._form_round()
            elif self.phase is Phase.RUNNING:
                await self._check_round()
        except DriverError as exc:
            self._finish(False, str(exc))

    async def _check_round(self) -> None:
        decision = decide_round(
            self.registry.records(),
            resets=self.registry.reset_count,
            reset_limit=self.settings.reset_limit,
            checkpoint_fallback=self.settings.checkpoint_fallback,
            raised=self._workers.raised(self.slots),
        )
        if decision.action is Action.WAIT:
            await self._scale_out()
        elif decision.action is Action.SUCCEED:
            self._finish(True, decision.reason or "training finished")
        elif decision.action is Action.FAIL:
            self._finish(False, self._with_worker_messages(decision.reason))
        else:
            self._blacklist(decision.blacklist)
            self.registry.count_reset()
            self.last_reset_reason = decision.reason or "hosts changed"
            self.journal.round_ended(self.round, len(self.slots))
            self.phase = Phase.FORMING
            self._capacity_wait_since = None
            await self._form_round()

    # ---- forming rounds ----------------------------------------------------------------

    async def _form_round(self) -> None:
        plan = plan_round(
            self.hosts.capacity(),
            self.settings,
            survivors=self._workers.survivors(self.slots) if self.round else None,
            waiting_since=self._capacity_wait_since,
            now=self._clock(),
        )
        if isinstance(plan, EndJob):
            self._finish(False, self._with_worker_messages(plan.reason))
            return
        if isinstance(plan, AwaitCapacity):
            if self._capacity_wait_since is None:
                logger.warning("%s", plan.message)
            self._capacity_wait_since = plan.since
            return
        self._capacity_wait_since = None
        if plan.from_checkpoint and not self._from_checkpoint:
            self._from_checkpoint = True
            logger.warning(
                "no worker of round %d survives: round %d starts %d fresh workers and its "
                "rank 0 loads the newest checkpoint",
                self.round,
                self.round + 1,
                len(plan.slots),
            )
            self.journal.fell_back(self.round)
        self.rendezvous.plan_next(self.round + 1, plan.slots)  # replacements' init() reads it
        await self._launch(plan.slots)
        await self._expire_slow_starters()
        formation = decide_formation(
            plan.slots, self._workers, current_round=self.round, recovering=self._recovering
        )
        if not isinstance(formation, AwaitBarrier):
            self._publish(formation)

    def _publish(self, publish: Publish) -> None:
        self.rendezvous.publish_round(publish.round_number, publish.slots, sync=publish.sync)
        self._workers.dismiss(publish.outgoing)
        for worker in publish.slots:
            record = self._workers[worker]
            record.last_round = publish.round_number
            record.departure = None  # a leaving worker whose host came back stays
        self.registry.start_round(publish.round_number, frozenset(publish.slots))
        self._recovering = False
        self._from_checkpoint = False
        self._newcomers_announced = False
        self.phase = Phase.RUNNING
        self.journal.published(
            publish.round_number,
            len(publish.slots),
            len(publish.newcomers),
            len(publish.outgoing),
            self.progress.samples_per_second if self.progress else 0.0,
        )
        logger.info(
            "round %d: %d workers on %s (sync=%s, newcomers=%d, dismissed=%d)",
            publish.round_number,
            len(publish.slots),
            ",".join(dict.fromkeys(w.hostname for w in publish.slots)),
            publish.sync,
            len(publish.newcomers),
            len(publish.outgoing),
        )

    async def _launch(self, workers: Iterable[WorkerId]) -> None:
        for worker in await self._workers.launch_missing(workers):
            self.on_worker_exit(worker, 127)

    async def _expire_slow_starters(self) -> None:
        timeout = self.settings.start_timeout_s
        for worker in slow_starters(self._workers, now=self._clock(), start_timeout_s=timeout):
            logger.error("worker %s did not register within %.0f s", worker, timeout)
            self._workers[worker].departure = Departure.FAILED
            await self._workers.stop(worker)
            self._blacklist({worker.hostname})
            self._wake.set()  # plan again without its host

    async def _stop_overdue(
        self, heartbeat_timeout_s: float | None, counts_from: float | None
    ) -> None:
        """Stop the workers on their way out that have not exited after the grace period:
        dismissed ones, and those whose process hangs after reporting how it ends (judged
        as evictions are: see ``timeouts.overdue_endings``)."""
        grace, now = self.settings.removal_grace_s, self._clock()
        for worker in overdue_dismissals(self._workers, now=now, grace_s=grace):
            logger.warning("dismissed worker %s did not exit; stopping it", worker)
            await self._workers.stop(worker)
        endings = overdue_endings(
            self._workers,
            now=now,
            grace_s=grace,
            heartbeat_timeout_s=heartbeat_timeout_s,
            counts_from=counts_from,
        )
        for worker in endings:
            reported = self._workers[worker].reported
            logger.warning(
                "worker %s reported %s and has not exited within %.0f s (its teardown hangs): "
                "stopping it",
                worker,
                reported.value if reported else "its end",
                grace,
            )
            await self._workers.stop(worker)

    async def _scale_out(self) -> None:
        """While a round runs: launch workers for new hosts, announce them once registered."""
        capacity = self.hosts.capacity()
        if self._scale_out_plan is None or self._scale_out_plan[0] != capacity:
            # Without survivors or a wait, the plan depends on the capacity alone (only an
            # AwaitCapacity, on which nothing scales out, holds the time): planned once per
            # change of the hosts, not at every step of a running job.
            plan = plan_round(
                capacity, self.settings, survivors=None, waiting_since=None, now=self._clock()
            )
            self._scale_out_plan = capacity, plan
        plan = self._scale_out_plan[1]
        decision = decide_scale_out(
            plan,
            self.slots,
            self._workers,
            leaving=self._workers.any_leaving(self.slots),
            announced=self._newcomers_announced,
            recovering=self._recovering,
        )
        if decision.action is ScaleOutAction.PREPARE:
            assert isinstance(plan, FormRound)
            self.rendezvous.plan_next(self.round + 1, plan.slots)  # newcomers' init() reads it
            await self._launch(decision.newcomers)
            await self._expire_slow_starters()
        elif decision.action is ScaleOutAction.ANNOUNCE:
            self._newcomers_announced = True
            self.rendezvous.post_notice(
                NoticeKind.HOSTS_ADDED, sorted({w.hostname for w in decision.newcomers})
            )

    # ---- endings -----------------------------------------------------------------------

    def _blacklist(self, hosts: Iterable[str]) -> None:
        for host in sorted(hosts):
            until = self.hosts.exclude(host)
            logger.warning("blacklisted host %s for %.0f s", host, until - self._clock())
            self.journal.blacklisted(host, until - self._clock(), self.round)

    def _with_worker_messages(self, reason: str) -> str:
        return "\n".join([reason, *self._workers.messages()])

    def _finish(self, success: bool, message: str) -> None:
        if self._result is None:
            self._result = JobResult(success, message, self.round, self.registry.reset_count)
            self.journal.finished(success, message, self.round)
            (logger.info if success else logger.error)(
                "job %s: %s", "succeeded" if success else "failed", message
            )
        self._wake.set()
