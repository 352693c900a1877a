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
    ExitVerdict,
    ReadyVerdict,
    classify_exit,
    classify_ready,
    decide_discovery_failure,
    decide_round,
    leaving_members,
)
from elasticjob.driver.driver_types import (
    Clock,
    Departure,
    DriverError,
    DriverPhase,
    DriverSettings,
    JobResult,
    WorkerLauncher,
)
from elasticjob.driver.host_manager import HostManager
from elasticjob.driver.job_snapshot import JobSnapshot
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
from elasticjob.driver.worker_record import ended_without_joining
from elasticjob.driver.workers import WorkerProcesses
from elasticjob.event_waits import wait_event
from elasticjob.rendezvous.rendezvous_types import JobRendezvous, ProbeReport, RendezvousListener
from elasticjob.wire.messages import (
    NoticeKind,
    ProgressRequest,
    ResultRequest,
    ScriptExit,
    SlotInfo,
    StepPace,
    WorkerId,
    WorkerState,
)

logger = logging.getLogger(__name__)

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
        self.registry = WorkerRegistry(lambda: self.rendezvous.current_slots)
        self.phase = DriverPhase.STARTING
        self.progress: ProgressRequest | None = None
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
            FormationMoves(self.on_worker_exit, self._blacklist, self._wake.set),
        )

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

    def rank_of(self, worker: WorkerId) -> int | None:
        """The worker's rank in the round in force (None: it has none, left or failed)."""
        slot = self.slots.get(worker)
        return slot.rank if slot is not None and not self._workers.gone(worker) else None

    def resume_resets(
        self, reset_count: int, restart_count: int, last_reset_reason: str | None
    ) -> None:
        """Carry on the job's reset history after a driver restart: ``reset_limit`` and
        ``restart_limit`` count the resets (and restarts) before it too, and the counts never
        go back."""
        self.registry.reset_count = max(self.registry.reset_count, reset_count)
        self.registry.restart_count = max(self.registry.restart_count, restart_count)
        self.last_reset_reason = self.last_reset_reason or last_reset_reason

    def adopt(self, round_number: int, slots: Mapping[WorkerId, SlotInfo], notice_seq: int) -> None:
        """Resume supervising a running round (the driver restarted): its members are taken
        as running and not at the barrier, and have the reach grace to find this driver
        (see ``liveness.Reachability``)."""
        self.rendezvous.adopt(round_number, slots, notice_seq)
        self._workers.adopt(slots, round_number)
        if self.reachability.since is not None:
            self.reachability.since = max(self.reachability.since, self._clock())
        self.registry.start_round(round_number)
        self.phase = DriverPhase.RUNNING
        self.journal.adopted(round_number, len(slots))
        logger.info("adopted round %d with %d workers", round_number, len(slots))

    def continue_after(self, round_number: int) -> None:
        """A suspended job resumes under this driver: its rounds are numbered on after
        ``round_number``, and its first round starts afresh (its rank 0 loads the newest
        durable checkpoint)."""
        self.rendezvous.continue_after(round_number)
        self.journal.resuming()
        logger.info("resuming the job after round %d", round_number)

    # ---- events (front end, listener and launcher callbacks; all on the event loop) -------

    def update_hosts(self, hosts: Mapping[str, int]) -> None:
        """The front end found these hosts, ``{host: slots}``: act on what changed (members
        on vanished hosts leave)."""
        update = self.hosts.update(hosts)
        if not update:
            return
        logger.info("hosts added: %s; removed: %s", list(update.added), list(update.removed))
        self._let_leave(update.removed)
        self._wake.set()

    def _let_leave(self, hosts: Iterable[str]) -> None:
        """The members on ``hosts`` leave at their next check (HOSTS_REMOVED), keeping their
        live state: no rollback."""
        leaving = leaving_members(self.phase, frozenset(hosts), self.slots, self._workers)
        if leaving:
            for worker in leaving:
                self._workers[worker].departure = Departure.LEAVING
            self.rendezvous.post_notice(
                NoticeKind.HOSTS_REMOVED, sorted({w.hostname for w in leaving})
            )

    def suspend(self) -> None:
        """End the job's run without losing work (see ``suspension.py``): the round's members
        save their last commit and stop; :meth:`run` then returns a suspended
        :class:`JobResult`. Asking again changes nothing."""
        if self._suspension is None and self._result is None:
            logger.info("suspending the job (round %d)", self.round)
            self._suspension = SuspendProgress(self._clock())
            self._wake.set()

    def discovery_failed(self, error: str) -> None:
        """The front end's host discovery failed with ``error``: the job ends if it never
        worked (a missing or broken script); otherwise the next discovery retries."""
        logger.warning("host discovery failed: %s", error)
        self.hosts.discovery_failed(error)
        if end := decide_discovery_failure(error, discovered_before=self.hosts.discovered):
            self._finish(False, end.reason)

    def on_worker_ready(
        self,
        worker: WorkerId,
        after_round: int,
        *,
        rolled_back: bool,
        script_exit: ScriptExit | None = None,
        suspended: bool = False,
    ) -> None:
        record = self._workers.get(worker)
        verdict = classify_ready(
            self.phase,
            known=record is not None,
            member=worker in self.slots,
            after_round=after_round,
            current_round=self.round,
            rolled_back=rolled_back,
            script_failed=script_exit is not None,
        )
        if verdict is ReadyVerdict.UNKNOWN or record is None:
            logger.warning("ignoring registration of unknown worker %s", worker)
            return
        record.waiting_after = max(record.waiting_after or 0, after_round)
        record.saved_for_suspension = suspended
        if verdict in (ReadyVerdict.READY, ReadyVerdict.ROLLED_BACK, ReadyVerdict.SCRIPT_FAILED):
            self.registry.record(worker, WorkerState.READY)
        if verdict is ReadyVerdict.SCRIPT_FAILED and script_exit is not None:
            self.registry.record_script_exit(worker, script_exit)
            logger.warning("the script of worker %s failed (%s)", worker, script_exit.status())
            self.journal.failed(worker.hostname, self.round, len(self.slots))
            self._fail_round(worker.hostname)
        elif verdict is ReadyVerdict.ROLLED_BACK:
            # After a failure every survivor rolls back: one line per job, not per worker.
            (logger.debug if self._recovering else logger.warning)(
                "worker %s rolled back after a collective failed", worker
            )
            self.registry.mark_rolled_back(worker)
            self.journal.collective_failed(worker.hostname, self.round, len(self.slots))
            self._fail_round(worker.hostname)
        self._wake.set()

    def on_worker_result(self, request: ResultRequest) -> None:
        worker = WorkerId(request.hostname, request.local_rank)
        record = self._workers.get(worker)
        if record is not None:
            record.ending_since = self._clock()
            record.reported = request.state
            record.heard_from = True
            record.message = request.message or record.message  # its exit is what counts
        if request.state is WorkerState.FAILURE:  # its script raised
            failure = ScriptExit(exit_code=request.exit_code or 1, log_tail=request.message)
            self.registry.record_script_exit(worker, failure)

    def on_progress(self, progress: ProgressRequest) -> None:
        self.progress = progress
        self.journal.progress(progress, self.round, len(self.slots))

    def on_worker_heartbeat(
        self, worker: WorkerId, report: ProbeReport | None, pace: StepPace | None
    ) -> None:
        if self._workers.beat(worker, report, pace):
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
            if record.ending and exit_code > 0:  # it said how it ends: its script's own exit
                failure = ScriptExit(exit_code=exit_code, log_tail=record.message)
                self.registry.record_script_exit(worker, failure)
            self.journal.failed(worker.hostname, self.round, len(self.slots))
            self._fail_round(worker.hostname)
        elif verdict is ExitVerdict.FAILED_OUTSIDE_ROUND:
            logger.warning("worker %s failed between rounds (exit code %d)", worker, exit_code)
            record.fail_outside_round(exit_code)
            self._blacklist({worker.hostname})
        elif verdict is ExitVerdict.ENDED_WITHOUT_JOINING:
            record.departure = Departure.FAILED
            self._finish(False, ended_without_joining(worker))
        self._wake.set()

    def _fail_round(self, host: str) -> None:
        """Tell the members once that the round is broken; the next round syncs state."""
        if not self._recovering:
            self._recovering = True
            self.rendezvous.post_notice(NoticeKind.ROUND_FAILED, (host,))

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
            self._blacklist(decision.blacklist)
            self.registry.count_reset(after_failure=decision.after_failure)
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
            self.rendezvous.post_notice(NoticeKind.SUSPEND)
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
        self.registry.start_round(publish.round_number)
        self._recovering = False
        self._formation.published()
        self.phase = DriverPhase.RUNNING
        self.journal.published(
            publish.round_number,
            len(publish.slots),
            len(publish.newcomers),
            len(publish.outgoing),
            self.progress.samples_per_second if self.progress else 0.0,
            hosts=tuple(sorted({w.hostname for w in publish.slots})),
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

    def _finish(self, success: bool, message: str) -> None:
        if self._result is None:
            self._result = JobResult(success, message, self.round, self.registry.reset_count)
            self.journal.finished(success, message, self.round)
            (logger.info if success else logger.error)(
                "job %s: %s", "succeeded" if success else "failed", message
            )
        self._wake.set()
