"""The events that reach one job's driver, as they happen and all on its event loop: the hosts
its front end finds (:meth:`DriverEvents.update_hosts`), a suspension or a failed discovery
asked by the front end, each worker's end with its cause (:meth:`DriverEvents.on_worker_exit`),
and the requests, reports and heartbeats of its workers from the job's rendezvous (the driver
is its :class:`~elasticjob.rendezvous.rendezvous_types.RendezvousListener`). Each is recorded
and judged here (``decisions.py``, ``worker_exits.py``); what follows for the round is the
driver's (``driver.py``), through the hooks :class:`DriverEvents` declares.
"""

from __future__ import annotations

import abc
import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping

from elasticjob.driver.decisions import (
    ReadyVerdict,
    classify_ready,
    decide_discovery_failure,
    leaving_members,
)
from elasticjob.driver.driver_types import (
    Clock,
    Departure,
    DriverObserver,
    DriverPhase,
    JobResult,
)
from elasticjob.driver.goodput import LostTo
from elasticjob.driver.host_manager import HostManager
from elasticjob.driver.job_record import EventKind, JobRecordData
from elasticjob.driver.journal import JobJournal
from elasticjob.driver.journal_events import HealthChecked, JournalListener
from elasticjob.driver.liveness import Reachability
from elasticjob.driver.registry import WorkerRegistry
from elasticjob.driver.suspension import SuspendProgress
from elasticjob.driver.worker_exits import (
    NO_EFFECTS,
    ExitCause,
    ExitEffects,
    ExitVerdict,
    classify_end,
    decide_exit,
)
from elasticjob.driver.worker_record import WorkerRecord, ended_without_joining
from elasticjob.driver.workers import WorkerProcesses
from elasticjob.rendezvous.rendezvous_types import JobRendezvous, ProbeReport, RendezvousListener
from elasticjob.wire.messages import (
    ExitAnswer,
    HeldShards,
    NoticeKind,
    ProgressRequest,
    ResultRequest,
    ScriptExit,
    SlotInfo,
    StepPace,
    WorkerId,
    WorkerState,
)
from elasticjob.wire.protocol import MAX_EXIT_REASON_CHARS

logger = logging.getLogger(__name__)


class DriverEvents(RendezvousListener, abc.ABC):
    """The events of one job's driver (see the module docstring): the state they read and
    record is the driver's, declared here; what follows them is its hooks'."""

    hosts: HostManager
    rendezvous: JobRendezvous
    registry: WorkerRegistry
    journal: JobJournal
    phase: DriverPhase
    _workers: WorkerProcesses
    _clock: Clock
    _wake: asyncio.Event
    _recovering: bool
    _result: JobResult | None
    _suspension: SuspendProgress | None
    reachability: Reachability
    last_reset_reason: str | None

    @property
    @abc.abstractmethod
    def round(self) -> int:
        """The round in force."""

    @property
    @abc.abstractmethod
    def slots(self) -> Mapping[WorkerId, SlotInfo]:
        """The members of the round in force."""

    @abc.abstractmethod
    def _fail_round(self, host: str) -> None:
        """Tell the members that the round is broken (its first failure, on ``host``)."""

    @abc.abstractmethod
    def _blacklist(self, hosts: Iterable[str]) -> None:
        """Keep ``hosts`` out."""

    @abc.abstractmethod
    def _finish(self, success: bool, message: str) -> None:
        """End the job."""

    # ---- the job's past, from its front end ------------------------------------------------

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

    def start_record(self, job: str, wall_clock: Callable[[], float], started: str) -> None:
        """Start the job's record (``job_record.py``), its first event saying how it
        ``started``."""
        self.journal.start_record(job, wall_clock, started)

    def resume_record(self, data: JobRecordData, wall_clock: Callable[[], float]) -> None:
        """Carry on the job's stored record (its front end restarted)."""
        self.journal.resume_record(data, wall_clock)

    def resume_account(
        self,
        committed_step: int | None,
        lost: Mapping[LostTo, float],
        running_for_s: float | None,
    ) -> None:
        """Carry on the job's account after a driver restart: rank 0's committed step (a
        durable fallback counts its lost steps from it; None: unknown) and the time it lost
        by cause in the ``running_for_s`` it ran (None: unknown)."""
        if committed_step is not None:
            self.journal.committed_step = committed_step
        if running_for_s is not None:
            self.journal.resume_lost_time(lost, running_for_s)

    def subscribe(self, listener: JournalListener) -> None:
        """Push what happens to the job to ``listener`` from now on (``journal_events.py``)."""
        self.journal.subscribe(listener)

    def observe(self, observer: DriverObserver) -> None:
        """Tell ``observer`` the durations the driver measures from now on."""
        self.journal.observer = observer

    # ---- the front end's events ------------------------------------------------------------

    def scaled(self, old: int, new: int) -> None:
        """Someone asked for ``new`` hosts instead of ``old`` (the operator: replicas)."""
        self.journal.scaled(old, new, self.round, len(self.slots))

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
            self._post_notice(NoticeKind.HOSTS_REMOVED, sorted({w.hostname for w in leaving}))

    def _post_notice(self, kind: NoticeKind, hosts: Iterable[str] = ()) -> None:
        """Tell the round's members ``kind`` about ``hosts``: the one way the driver posts a
        notice, so that the record's state (the newest notice) is saved with it."""
        self.rendezvous.post_notice(kind, hosts)
        self.journal.state_changed()

    def suspend(self) -> None:
        """End the job's run without losing work (see ``suspension.py``): the round's members
        save their last commit and stop; :meth:`run` then returns a suspended
        :class:`JobResult`. Asking again changes nothing."""
        if self._suspension is None and self._result is None:
            logger.info("suspending the job (round %d)", self.round)
            self._suspension = SuspendProgress(self._clock())
            self._wake.set()

    def health_checked(self, checked: HealthChecked) -> None:
        """A new pod's health check ended (its front end runs the checks)."""
        self.journal.health_checked(checked, self.round)

    def note(self, kind: EventKind, message: str, *, host: str = "", warning: bool) -> None:
        """What the front end learnt about ``host`` that the job's record tells (kinds
        ``WORKER_FAILED``, ``LEAVING``, ``CLAMPED``; see ``job_record.EventKind``);
        ``warning``: it is bad news."""
        self.journal.noted(kind, message, host=host, warning=warning)

    def discovery_failed(self, error: str) -> None:
        """The front end's host discovery failed with ``error``: the job ends if it never
        worked (a missing or broken script); otherwise the next discovery retries."""
        logger.warning("host discovery failed: %s", error)
        self.hosts.discovery_failed(error)
        if end := decide_discovery_failure(error, discovered_before=self.hosts.discovered):
            self._finish(False, end.reason)

    # ---- the workers' events ----------------------------------------------------------------

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
        record.held_shards = held_shards
        if verdict in (ReadyVerdict.READY, ReadyVerdict.ROLLED_BACK, ReadyVerdict.SCRIPT_FAILED):
            self.registry.record(worker, WorkerState.READY)
        if verdict is ReadyVerdict.SCRIPT_FAILED and script_exit is not None:
            self.registry.record_script_exit(worker, script_exit)
            logger.warning("the script of worker %s failed (%s)", worker, script_exit.status())
            self.journal.failed(worker.hostname, self.round, len(self.slots))
        elif verdict is ReadyVerdict.ROLLED_BACK:
            # After a failure every survivor rolls back: one line per job, not per worker.
            (logger.debug if self._recovering else logger.warning)(
                "worker %s rolled back after a collective failed", worker
            )
            self.registry.mark_rolled_back(worker)
            self.journal.collective_failed(worker.hostname, self.round, len(self.slots))
        if (
            verdict in (ReadyVerdict.ROLLED_BACK, ReadyVerdict.SCRIPT_FAILED)
            and not self._recovering
        ):
            self._fail_round(worker.hostname)
        self._wake.set()

    def is_dismissed(self, worker: WorkerId) -> bool:
        record = self._workers.get(worker)
        return record is not None and record.departure is Departure.DISMISSED

    def on_worker_result(self, request: ResultRequest) -> None:
        worker = WorkerId(request.hostname, request.local_rank)
        record = self._workers.get(worker)
        if record is not None:
            record.ending_since = self._clock()
            record.heard_from = True
        if request.script_exit is not None:  # its script raised
            if record is not None:
                record.message = request.script_exit.log_tail or record.message
            self.registry.record_script_exit(worker, request.script_exit)

    def on_worker_exit_seen(self, worker: WorkerId, exit_code: int) -> ExitAnswer:
        record = self._workers.get(worker)
        if record is None or not record.running or record.exit_seen is not None:
            return ExitAnswer(restart=False)
        logger.warning("worker %s ended with %d (its pod saw it)", worker, exit_code)
        loss = self._workers.slot_loss(worker, self.slots)
        restarts = loss.restarts and self._verdict(worker, record, exit_code) is ExitVerdict.FAILED
        if restarts and self.on_worker_exit(worker, exit_code, ExitCause.SLOT_ENDED).restart:
            told = f"slot {worker.local_rank} ended with {exit_code}, restarts in place"
            self.note(EventKind.WORKER_FAILED, f"{worker.hostname}: {told} ({loss.reason})",
                      host=worker.hostname, warning=True)  # fmt: skip
            return ExitAnswer(restart=True, reason=loss.reason[:MAX_EXIT_REASON_CHARS])
        record.exit_seen = exit_code
        self._wake.set()
        return ExitAnswer(restart=False)

    def on_progress(self, progress: ProgressRequest) -> None:
        self.journal.progress(progress, self.round, len(self.slots))

    def on_incompatible_worker(self, message: str) -> None:
        self._finish(False, f"a worker runs an image of another elasticjob release: {message}")

    def on_worker_heartbeat(
        self,
        worker: WorkerId,
        report: ProbeReport | None,
        pace: StepPace | None,
        held_shards: HeldShards | None = None,
    ) -> None:
        if self._workers.beat(worker, report, pace, held_shards):
            self._wake.set()  # a member reports a peer it cannot reach: judge at once

    def on_worker_exit(
        self, worker: WorkerId, exit_code: int, cause: ExitCause = ExitCause.EXITED
    ) -> ExitEffects:
        """A worker process ended with ``exit_code`` (``cause``: how the front end learned
        it), reported once by the front end: record what it means, carry out the driver's
        part of what follows (``worker_exits.decide_exit``: the blacklisting, the round's
        failure) and return the effects, whose rest the front end carries out. A worker
        this driver never launched (a pod that failed before it ran) has no verdict, but its
        failure has effects all the same."""
        record = self._workers.get(worker)
        if record is not None and not record.running:
            return NO_EFFECTS  # its end was heard already
        verdict = None
        if record is not None:
            verdict = self._verdict(worker, record, exit_code)  # while it counts as running
            record.running = False
            self._record_exit(worker, record, verdict, exit_code)
        effects = decide_exit(
            verdict,
            cause,
            exit_code,
            recovering=self._recovering,
            restart_slot=cause is ExitCause.SLOT_ENDED
            and verdict is ExitVerdict.FAILED
            and self._workers.restart_in_place(worker, self.slots),
        )
        if effects.blacklist:
            self._blacklist({worker.hostname})
        if effects.fail_round:
            self._fail_round(worker.hostname)
        self._wake.set()
        return effects

    def _verdict(self, worker: WorkerId, record: WorkerRecord, exit_code: int) -> ExitVerdict:
        """What the end of ``worker``'s process with ``exit_code`` means now (its record
        still counting it as running)."""
        return classify_end(
            self.phase,
            record,
            exit_code,
            member=worker in self.slots,
            reported=self.rendezvous.reported_result(worker),
        )

    def _record_exit(
        self, worker: WorkerId, record: WorkerRecord, verdict: ExitVerdict, exit_code: int
    ) -> None:
        """Record what the end of ``worker``'s process means (``verdict``)."""
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
        elif verdict is ExitVerdict.LEFT_MID_ROUND:
            logger.warning(
                "leaving worker %s ended before round %d released it (exit code %d): the "
                "round fails",
                worker,
                self.round,
                exit_code,
            )
            self.journal.failed(worker.hostname, self.round, len(self.slots), leaving=True)
        elif verdict is ExitVerdict.FAILED_OUTSIDE_ROUND:
            logger.warning("worker %s failed between rounds (exit code %d)", worker, exit_code)
            record.fail_outside_round(exit_code)
        elif verdict is ExitVerdict.ENDED_WITHOUT_JOINING:
            record.departure = Departure.FAILED
            self._finish(False, ended_without_joining(worker))
