"""The elastic driver of one job: carries out what ``decisions.py`` decides, against the
job's worker processes (``workers.py``, through a :class:`WorkerLauncher`) and its rendezvous;
``round_formation.py`` forms its rounds.

Lifecycle (:class:`DriverPhase`): STARTING -> RUNNING (a round is in force) -> FORMING (the round
ended at the barrier; the next one is launched, awaited and published) -> RUNNING ... ->
FINISHED. Newcomers are launched while a round runs and announced (HOSTS_ADDED) only once all
have registered; members on vanished hosts *leave* (HOSTS_REMOVED), reach the barrier and are
then *dismissed*; when a member fails, or rolls back after a collective failed on it alone,
ROUND_FAILED is posted at once and the next round is synced from rank 0.
A suspension (:meth:`ElasticDriver.suspend`, see ``suspension.py``) posts SUSPEND to the round's
members and ends the run once they saved their state and stopped.
Everything reaches the driver as an event when it happens: the hosts found from the front end
(:meth:`ElasticDriver.update_hosts`), exits from the launcher, requests and reports from the
rendezvous. The loop can be driven step by step (:meth:`ElasticDriver.step`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Final

from elasticjob.driver.decisions import (
    Action,
    decide_round,
)
from elasticjob.driver.driver_events import DriverEvents
from elasticjob.driver.driver_types import (
    Clock,
    DriverError,
    DriverPhase,
    DriverSettings,
    JobResult,
    WorkerLauncher,
)
from elasticjob.driver.host_manager import HostManager
from elasticjob.driver.job_snapshot import JobSnapshot
from elasticjob.driver.job_state import JobState, job_state
from elasticjob.driver.journal import JobJournal
from elasticjob.driver.liveness import Reachability
from elasticjob.driver.loop_lag import LoopLagWatch
from elasticjob.driver.planning import EndJob, Publish
from elasticjob.driver.registry import WorkerRegistry
from elasticjob.driver.round_formation import FormationMoves, RoundFormation
from elasticjob.driver.stragglers import Straggler, find_stragglers
from elasticjob.driver.suspension import (
    SuspendDecision,
    SuspendMove,
    SuspendProgress,
    decide_suspension,
)
from elasticjob.driver.timeouts import past_active_deadline
from elasticjob.driver.workers import WorkerProcesses
from elasticjob.event_waits import wait_event
from elasticjob.rendezvous.rendezvous_types import JobRendezvous, RendezvousListener
from elasticjob.wire.messages import (
    NoticeKind,
    ProgressRequest,
    SlotInfo,
    WorkerId,
)

logger = logging.getLogger(__name__)

TICK_S: Final = 1.0
"""The loop runs a step at least this often, even when nothing wakes it (timeouts)."""


class ElasticDriver(DriverEvents):
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
        self.registry = WorkerRegistry(
            lambda: self.rendezvous.current_slots, lambda: self.rendezvous.current_round
        )
        self.phase = DriverPhase.STARTING
        self._workers = WorkerProcesses(self.launcher, self.rendezvous, clock)
        self.reachability = Reachability()
        """Whether the workers can reach this driver (its front end keeps it up to date)."""
        self._loop_lag = loop_lag or LoopLagWatch(clock)
        self._recovering = False
        self._wake = asyncio.Event()
        self._result: JobResult | None = None
        self._suspension: SuspendProgress | None = None
        self.stragglers: dict[WorkerId, Straggler] = {}
        """The members of the round in force found slow (``stragglers.py``)."""
        self.last_reset_reason: str | None = None
        self.journal = JobJournal(clock)
        """What happened to the job: goodput, its record, its observer (``journal.py``)."""
        self._formation = RoundFormation(
            hosts,
            settings,
            self._workers,
            self.rendezvous,
            self.journal,
            clock,
            FormationMoves(self.on_worker_exit, self._blacklist, self._wake.set, self._post_notice),
        )

    # ---- queries -----------------------------------------------------------------------

    @property
    def round(self) -> int:
        return self.rendezvous.current_round

    @property
    def slots(self) -> Mapping[WorkerId, SlotInfo]:
        return self.rendezvous.current_slots

    @property
    def progress(self) -> ProgressRequest | None:
        """Rank 0's latest progress report (kept by the job's rendezvous)."""
        return self.rendezvous.progress

    @property
    def result(self) -> JobResult | None:
        """How the job ended, once it has."""
        return self._result

    @property
    def finishing(self) -> bool:
        """Whether the job is finishing: a member of the round in force finished its training
        (a new worker would only find the job over)."""
        return self.registry.any_succeeded()

    @property
    def suspending(self) -> bool:
        """Whether a suspension was asked for (:meth:`suspend`)."""
        return self._suspension is not None

    def snapshot(self) -> JobSnapshot:
        """What the driver knows now, as one value (the read model of the job)."""
        return JobSnapshot(
            now=self._clock(),
            phase=self.phase,
            result=self._result,
            recovering=self._recovering,
            round=self.round,
            slots=self.slots,
            reset_count=self.registry.reset_count,
            restart_count=self.registry.restart_count,
            last_reset_reason=self.last_reset_reason,
            progress=self.progress,
            committed_step=self.journal.committed_step,
            lost_time=self.journal.lost_time,
            last_checkpoint=self.journal.last_checkpoint,
            restore=self.journal.restore,
            notice_seq=self.rendezvous.round_info().latest_notice_seq,
            stragglers=dict(self.stragglers),
            stragglers_found=self.journal.stragglers_found,
        )

    def job_state(self) -> JobState:
        """What the next driver of the job would resume from now (``job_state.py``)."""
        journal = self.journal
        return job_state(
            self.snapshot(),
            self.hosts.blacklist,
            wall_now=journal.wall_clock(),
            suspended_seconds=journal.suspended_seconds,
            suspended_since=journal.suspended_since,
        )

    def rank_of(self, worker: WorkerId) -> int | None:
        """The worker's rank in the round in force (None: it has none, left or failed)."""
        slot = self.slots.get(worker)
        return slot.rank if slot is not None and not self._workers.gone(worker) else None

    # ---- what the events ask of the driver (``driver_events.py``) ------------------------

    def _fail_round(self, host: str) -> None:
        """Tell the members that the round is broken (the first failure of the round, on
        ``host``); the next round syncs state."""
        self._recovering = True
        self._post_notice(NoticeKind.ROUND_FAILED, (host,))

    # ---- main loop -------------------------------------------------------------------------

    async def run(self) -> JobResult:
        """Run the job to completion and return its result."""
        try:
            with self._loop_lag.subscribed(self.reachability):
                while self._result is None:
                    await self.step()
                    await wait_event(self._wake, TICK_S)
        finally:
            self.phase = DriverPhase.FINISHED
            self.rendezvous.finish(self._result.message if self._result else "driver stopped")
            await self.launcher.stop_all()
        assert self._result is not None
        return self._result

    async def step(self) -> None:
        """One pass of the loop: act on everything that happened since the last one (nothing
        once the job has its result)."""
        self._wake.clear()
        if self._result is not None:
            return
        try:
            timeout = self.settings.heartbeat_timeout_s
            self._loop_lag.catch_up()
            deadline = self.settings.active_deadline_s
            if expired := past_active_deadline(self.journal.running_seconds(), deadline):
                self._finish(False, expired, deadline_exceeded=True)
                return
            counts_from = self.reachability.silence_counts_from()
            await self._workers.kill_unanswering(timeout, self.slots, self.round, counts_from)
            await self._workers.stop_overdue(self.settings.removal_grace_s, timeout, counts_from)
            if self._suspension is not None and self._carry_suspension(self._suspension):
                return
            if self.phase is DriverPhase.STARTING or self.phase is DriverPhase.FORMING:
                await self._form_round()
            elif self.phase is DriverPhase.RUNNING:
                await self._check_round()
        except DriverError as exc:
            self._finish(False, str(exc))

    async def _check_round(self) -> None:
        decision = decide_round(
            self.registry.records(leaving=self._workers.leaving(self.slots)),
            resets=self.registry.reset_count,
            reset_limit=self.settings.reset_limit,
            checkpoint_fallback=self.settings.checkpoint_fallback,
            restarts=self.registry.restart_count,
            restart_limit=self.settings.restart_limit,
            failed_rounds_without_commit=self.registry.failed_rounds_without_commit(
                self.journal.committed_step
            ),
            max_failed_rounds_without_commit=self.settings.max_failed_rounds_without_commit,
        )
        if decision.action is Action.WAIT:
            self._watch_stragglers()
            if self._suspension is None:  # no newcomers for a job being suspended
                await self._formation.scale_out(self.round, self.slots, recovering=self._recovering)
        elif decision.action is Action.SUCCEED:
            self._finish(True, decision.reason or "training finished")
        elif decision.action is Action.FAIL:
            self._finish(False, self._with_worker_messages(decision.reason))
        else:
            self.registry.count_reset(
                after_failure=decision.after_failure, committed_step=self.journal.committed_step
            )
            self.last_reset_reason = decision.reason or "hosts changed"
            self.journal.round_ended(self.round, len(self.slots))
            self.phase = DriverPhase.FORMING
            self._formation.round_ended()
            await self._form_round()

    def _watch_stragglers(self) -> None:
        """Find the round's slow members; a newly flagged one is told to the journal and,
        with the policy, replaced: its host is blacklisted and it leaves (no rollback)."""
        policy, before = self.settings.stragglers, self.stragglers
        if self._recovering:  # a broken round's paces say nothing
            self.stragglers = {}
            return
        members = [w for w in self.slots if not self._workers.gone(w)]
        found = find_stragglers(
            self._workers.paces(members), self.round, before, policy, self._clock()
        )
        for worker, straggler in found.items():
            if not straggler.flagged or (worker in before and before[worker].flagged):
                continue
            rank = self.slots[worker].rank
            logger.warning(
                "rank %d (%s) is a straggler: its steps are %.2fx the others'",
                rank,
                worker,
                straggler.slowdown,
            )
            self.journal.straggler(worker.hostname, rank, straggler.slowdown, self.round)
            if policy.replace:
                self._blacklist({worker.hostname})
                self._let_leave({worker.hostname})
        self.stragglers = found

    def _carry_suspension(self, progress: SuspendProgress) -> bool:
        """Carry the suspension's next move out; return whether the step ends here (False:
        a round is still being formed or recovered, or is to be formed again, which the step
        goes on with)."""
        members = list(self.slots)
        waiting = [w for w in members if self._workers.at_barrier(w)]
        saved = sum(self._workers[w].saved_for_suspension for w in waiting)
        decision = decide_suspension(
            progress,
            self.phase,
            current_round=self.round,
            recovering=self._recovering,
            members=len(members),
            stopped=sum(self._workers.stopped(w) for w in members),
            saved=saved,
            unsaved=len(waiting) - saved,
            now=self._clock(),
            timeout_s=self.settings.suspend_timeout_s,
        )
        if decision.move is SuspendMove.NOTIFY:
            self._post_notice(NoticeKind.SUSPEND)
            self._suspension = dataclasses.replace(progress, notified_round=self.round)
        elif decision.move is SuspendMove.REFORM:
            logger.info("workers stopped without saving their state: the next round is told")
            self._suspension = dataclasses.replace(progress, notified_round=None)
            return False
        elif decision.move is SuspendMove.END:
            self._end_suspended(decision)
        return progress.notified_round is not None or decision.move is not SuspendMove.WAIT

    # ---- forming rounds ----------------------------------------------------------------

    async def _form_round(self) -> None:
        survivors = self._workers.survivors(self.slots) if self.slots else None
        outcome = await self._formation.next_round(self.round, survivors, self._recovering)
        if isinstance(outcome, EndJob) and self._suspension is not None:
            # A suspension ends the run rather than fail it: the job resumes from its newest
            # checkpoint with the capacity it then has.
            self._end_suspended(SuspendDecision(SuspendMove.END, outcome.reason, clean=False))
        elif isinstance(outcome, EndJob):
            self._finish(False, self._with_worker_messages(outcome.reason))
        elif isinstance(outcome, Publish):
            self._publish(outcome)

    def _publish(self, publish: Publish) -> None:
        self.rendezvous.publish_round(publish.round_number, publish.slots, sync=publish.sync)
        self._workers.dismiss(publish.outgoing)
        for worker in publish.slots:
            record = self._workers[worker]
            record.last_round = publish.round_number
            record.departure = None  # a leaving worker whose host came back stays
        self._recovering = False
        self._formation.published()
        self.phase = DriverPhase.RUNNING
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

    # ---- endings -----------------------------------------------------------------------

    def _blacklist(self, hosts: Iterable[str]) -> None:
        for host in sorted(hosts):
            exclusion = self.hosts.exclude(host)
            if exclusion is None:
                continue  # the front end kept it out for this failure already
            seconds = exclusion.until - self._clock()
            where = "" if exclusion.key == host else f" ({exclusion.key}, where it runs)"
            logger.warning("blacklisted host %s%s for %.0f s", host, where, seconds)
            self.journal.blacklisted(exclusion.key, seconds, self.round)

    def _end_suspended(self, decision: SuspendDecision) -> None:
        message = f"suspended: {decision.reason}"
        self._result = JobResult(
            False, message, self.round, self.registry.reset_count, suspended=True
        )
        self.journal.suspended(message, self.round)
        (logger.info if decision.clean else logger.warning)("job %s", message)
        self._wake.set()

    def _with_worker_messages(self, reason: str) -> str:
        return "\n".join([reason, *self._workers.messages()])

    def _finish(self, success: bool, message: str, *, deadline_exceeded: bool = False) -> None:
        if self._result is None:
            resets = self.registry.reset_count
            self._result = JobResult(
                success, message, self.round, resets, deadline_exceeded=deadline_exceeded
            )
            self.journal.finished(success, message, self.round)
            (logger.info if success else logger.error)(
                "job %s: %s", "succeeded" if success else "failed", message
            )
        self._wake.set()
