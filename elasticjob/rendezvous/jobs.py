"""The in-memory rendezvous state of one job, with asyncio long-polls.

A job keeps nothing for a worker its driver did not admit (:meth:`~InMemoryJobRendezvous.
readmit` before each launch, or membership of a published or adopted round), and bounds what
admitted workers can make it keep and hold by the job's :class:`~elasticjob.rendezvous.limits.
JobLimits`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Final, TypeVar

from elasticjob.rendezvous.admitted_workers import AdmittedWorkers
from elasticjob.rendezvous.health_checks import HealthChecks, HealthListener
from elasticjob.rendezvous.health_rule import HealthPolicy
from elasticjob.rendezvous.job_credentials import JobKey, check_job_name
from elasticjob.rendezvous.limits import DEFAULT_MAX_WORKERS, InFlight, JobLimits, TokenBucket
from elasticjob.rendezvous.notice_log import NoticeLog
from elasticjob.rendezvous.probes import peer_endpoints, probe_report, probe_targets
from elasticjob.rendezvous.published_rounds import Endpoint, PublishedRound, check_slots
from elasticjob.rendezvous.rendezvous_types import (
    JobRendezvous,
    Refusal,
    RendezvousError,
    RendezvousListener,
    RequestRefused,
)
from elasticjob.rendezvous.wakeup import LongPolls, Wakeup
from elasticjob.wire.messages import (
    ExitAnswer,
    ExitReport,
    HeartbeatRequest,
    Notice,
    NoticeKind,
    NoticesResponse,
    PlannedRound,
    ProgressRequest,
    RendezvousRequest,
    RendezvousResponse,
    RendezvousStatus,
    ResultRequest,
    RoundInfo,
    SlotInfo,
    WorkerId,
    WorkerState,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")

_NO_SLOTS: Final[Mapping[WorkerId, SlotInfo]] = MappingProxyType({})


class InMemoryJobRendezvous(JobRendezvous):
    """:class:`JobRendezvous` kept in memory, for one job on one event loop.

    Raises :class:`ValueError` if ``job`` is not a valid job name or ``key`` is empty or not
    printable ASCII without spaces (its credentials travel in ``Authorization: Bearer``).
    ``limits`` bound what its workers can make it keep and hold (``clock``: for the rate).
    """

    def __init__(
        self,
        job: str,
        key: str,
        listener: RendezvousListener,
        *,
        limits: JobLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        check_job_name(job)
        self.key = JobKey(key)
        self.job = job
        self.limits = limits or JobLimits.for_workers(DEFAULT_MAX_WORKERS)
        self._listener = listener
        self._bucket = TokenBucket(self.limits.requests_per_s, self.limits.burst, clock)
        self._polls = LongPolls(self.limits.long_polls, lambda: self._closing)
        self.bodies = InFlight(self.limits.bodies)
        self._workers = AdmittedWorkers(job)
        self._round: PublishedRound | None = None
        self._numbered_after = 0
        """The round before the first one published (see :meth:`continue_after`)."""
        self._plan = PlannedRound()
        self._finished: str | None = None
        self._closing = False
        self._notices = NoticeLog(job)
        self._progress: ProgressRequest | None = None
        self._round_changed = Wakeup()
        self._clock = clock
        self.health_checks: HealthChecks | None = None
        """The checks of the job's new pods (None: it runs none; see :meth:`check_health`)."""

    def __repr__(self) -> str:
        return f"InMemoryJobRendezvous(job={self.job!r}, round={self.current_round})"

    def take_request(self) -> float:
        """Count one request against the job's rate: 0.0 if it may be served, else the
        seconds until one may."""
        return self._bucket.take()

    @property
    def long_polls(self) -> int:
        """How many long-polls of this job are waiting now."""
        return self._polls.held

    @property
    def rank_zero_host(self) -> str | None:
        """The host of rank 0 in the round in force (None: no round yet)."""
        return None if self._round is None else next(iter(self._round.hosts), None)

    @property
    def finished(self) -> bool:
        """Whether :meth:`finish` was called."""
        return self._finished is not None

    def close_waits(self) -> None:
        """Answer every pending long-poll now, as if its wait had run out, and make later
        requests answer without waiting (the service is shutting down)."""
        self._closing = True
        self._round_changed.fire()
        self._notices.posted.fire()
        if self.health_checks is not None:
            self.health_checks.close()

    def check_health(self, policy: HealthPolicy, listener: HealthListener) -> HealthChecks:
        """Have the job's new pods checked before they join (``health_checks.py``), their
        requests bounded by the job's long-polls; ``listener`` hears every verdict."""
        self.health_checks = HealthChecks(self.job, policy, listener, self._polls, self._clock)
        return self.health_checks

    # ---- driver side -------------------------------------------------------------------

    def publish_round(
        self, round_number: int, slots: Mapping[WorkerId, SlotInfo], *, sync: bool
    ) -> None:
        """See :meth:`JobRendezvous.publish_round`. Also raises :class:`RendezvousError` if
        ``round_number`` is not newer than the current round or the slots are not ranks
        ``0..size-1`` exactly once (each slot naming its worker)."""
        if round_number <= self.current_round:
            raise RendezvousError(
                f"job {self.job}: round {round_number} is not newer than {self.current_round}"
            )
        rank0 = check_slots(slots)
        binding = self._workers.entry(rank0).binding
        if binding is None:
            raise RendezvousError(f"job {self.job}: rank-0 member {rank0} has not registered")
        targets = probe_targets(slots)
        peers = peer_endpoints(targets, self._workers.endpoints())
        self._round = PublishedRound(
            round_number,
            dict(slots),
            binding.endpoint,
            self._notices.latest_seq,
            sync,
            targets,
            peers,
        )
        self._plan = PlannedRound()
        self._workers.admit(slots)
        logger.info(
            "job %s: round %d published with %d members", self.job, round_number, len(slots)
        )
        self._round_changed.fire()

    def plan_next(self, round_number: int, slots: Mapping[WorkerId, SlotInfo]) -> None:
        """See :meth:`JobRendezvous.plan_next`."""
        ordered = sorted(slots.values(), key=lambda slot: slot.rank)
        self._plan = PlannedRound(round=round_number, slots=tuple(ordered))

    def planned_round(self) -> PlannedRound:
        """See :meth:`JobRendezvous.planned_round`."""
        return self._plan if self._plan.round > self.current_round else PlannedRound()

    def dismiss(self, workers: Iterable[WorkerId]) -> None:
        """See :meth:`JobRendezvous.dismiss`."""
        dismissed = set(workers)
        if not dismissed:
            return
        self._workers.forget_announced(dismissed)
        logger.info("job %s: dismissed %s", self.job, ", ".join(map(str, sorted(dismissed))))
        self._round_changed.fire()

    def adopt(self, round_number: int, slots: Mapping[WorkerId, SlotInfo], notice_seq: int) -> None:
        """See :meth:`JobRendezvous.adopt`."""
        if self._round is not None:
            raise RendezvousError(
                f"job {self.job}: cannot adopt a round after round {self.current_round}"
            )
        check_slots(slots)
        self._notices.continue_after(notice_seq)
        self._round = PublishedRound(
            round_number, dict(slots), None, self._notices.latest_seq, False, probe_targets(slots)
        )
        self._workers.admit(slots)
        logger.info("job %s: adopted round %d with %d members", self.job, round_number, len(slots))

    def continue_after(self, round_number: int) -> None:
        """See :meth:`JobRendezvous.continue_after`."""
        if self._round is not None:
            raise RendezvousError(
                f"job {self.job}: cannot number rounds after {round_number} once round "
                f"{self.current_round} is in force"
            )
        self._numbered_after = round_number

    def readmit(self, workers: Iterable[WorkerId]) -> None:
        """See :meth:`JobRendezvous.readmit`."""
        self._workers.readmit(workers)

    def post_notice(self, kind: NoticeKind, hosts: Iterable[str] = ()) -> Notice:
        """See :meth:`JobRendezvous.post_notice`. Raises :class:`RendezvousError` if a host is
        not a valid host name (see ``notice_log.py``)."""
        notice = self._notices.post(kind, self.current_round, tuple(hosts))
        logger.info("job %s: notice %d %s %s", self.job, notice.seq, kind, notice.hosts)
        return notice

    def finish(self, message: str) -> None:
        """See :meth:`JobRendezvous.finish`. Pending notice long-polls are answered too, and
        later ones do not wait. Finishing again keeps the first message."""
        if self._finished is None:
            self._finished = message
            logger.info("job %s: finished: %s", self.job, message)
        self._round_changed.fire()
        self._notices.posted.fire()
        if self.health_checks is not None:
            self.health_checks.close()

    @property
    def current_round(self) -> int:
        """See :attr:`JobRendezvous.current_round`."""
        return self._numbered_after if self._round is None else self._round.number

    @property
    def current_slots(self) -> Mapping[WorkerId, SlotInfo]:
        """See :attr:`JobRendezvous.current_slots`. A read-only view, not a copy: the driver
        asks on every worker event (copying 1,024 slots made registrations cost O(N^2))."""
        return _NO_SLOTS if self._round is None else MappingProxyType(self._round.slots)

    @property
    def progress(self) -> ProgressRequest | None:
        """See :attr:`JobRendezvous.progress`."""
        return self._progress

    # ---- worker side -------------------------------------------------------------------

    async def rendezvous(self, request: RendezvousRequest) -> RendezvousResponse:
        """See :meth:`JobRendezvous.rendezvous`. Answers at once, in this order of precedence:
        ``FINISHED`` once the job has finished, ``REMOVED`` for a dismissed worker (neither of
        these registers the worker or tells the listener), ``ASSIGNED`` when the worker is a
        member of a round newer than ``after_round``. A worker's endpoint is bound by its first
        registration for an ``after_round``; an older ``after_round`` (a stale retry) binds
        nothing."""
        worker = WorkerId(request.hostname, request.local_rank)
        self._check_worker(worker, asking_for_a_round=True)
        self._check_round(request.after_round)
        endpoint = Endpoint(request.address, request.store_port, request.probe_port)
        self._workers.bind(worker, request.after_round, endpoint)
        if request.wait_seconds > 0 and self._answer(worker, request.after_round) is None:
            self._polls.check_room()  # refused before anything is registered
        heard = self._finished is None and not self._listener.is_dismissed(worker)
        if heard and self._workers.register(worker, request.after_round, endpoint):
            self._announce(worker, request)
        return await self._polls.wait(
            lambda: self._answer(worker, request.after_round),
            request.wait_seconds,
            self._round_changed,
            lambda: RendezvousResponse(status=RendezvousStatus.PENDING),
        )

    def _check_worker(self, worker: WorkerId, *, asking_for_a_round: bool = False) -> None:
        """Refuse a worker the driver did not admit, keeping nothing of it. Retryably when it
        asks for a round (a pod can start and ask before the driver has planned it, and after
        a restart the driver takes back the previous service's processes only when it
        launches its first round); for good otherwise, once the job has published a round of
        its own."""
        own_round = self._round is not None and self._round.store is not None
        self._workers.check(worker, retryably=asking_for_a_round or not own_round)

    def _check_round(self, round_number: int) -> None:
        if round_number > self.current_round:
            newest = f"round {self.current_round}, the newest job {self.job} has published"
            refusal = f"round {round_number} is newer than {newest}"
            raise RequestRefused(Refusal.FUTURE_ROUND, refusal)

    def _announce(self, worker: WorkerId, request: RendezvousRequest) -> None:
        """Tell the listener that ``worker`` asks for the round after ``after_round``."""
        self._tell_listener(
            lambda listener: listener.on_worker_ready(
                worker,
                request.after_round,
                rolled_back=request.rolled_back,
                script_exit=request.script_exit,
                suspended=request.suspended,
                held_shards=request.held_shards,
            ),
        )

    def _answer(self, worker: WorkerId, after_round: int) -> RendezvousResponse | None:
        if self._finished is not None:
            return RendezvousResponse(status=RendezvousStatus.FINISHED, message=self._finished)
        if self._listener.is_dismissed(worker):
            return RendezvousResponse(
                status=RendezvousStatus.REMOVED, message=f"{worker} was dismissed from the job"
            )
        current = self._round
        if current is None or current.number <= after_round or worker not in current.slots:
            return None
        if current.store is None:
            return None  # an adopted round cannot be joined late; wait for the next
        return RendezvousResponse(
            status=RendezvousStatus.ASSIGNED,
            round=current.number,
            slot=current.slots[worker],
            store_address=current.store.address,
            store_port=current.store.store_port,
            notice_seq=current.notice_seq,
            sync=current.sync,
            peers=current.peers.get(worker, ()),
        )

    async def notices(self, after_seq: int, wait_seconds: float) -> NoticesResponse:
        """See :meth:`JobRendezvous.notices`. Does not wait once the job has finished. A
        client asking after a sequence number that is no longer kept gets every kept notice
        newer than it (``latest_seq`` tells it how far the log has gone)."""

        def answer() -> NoticesResponse | None:
            found = self._notices.after(after_seq)
            if found or self._finished is not None:
                return NoticesResponse(notices=found, latest_seq=self._notices.latest_seq)
            return None

        return await self._polls.wait(
            answer,
            wait_seconds,
            self._notices.posted,
            lambda: NoticesResponse(notices=(), latest_seq=self._notices.latest_seq),
        )

    def report_result(self, request: ResultRequest) -> None:
        """See :meth:`JobRendezvous.report_result`."""
        worker = WorkerId(request.hostname, request.local_rank)
        self._check_worker(worker)
        self._workers.report_result(worker, request.state)
        logger.info("job %s: %s reported %s", self.job, worker, request.state)
        self._tell_listener(lambda listener: listener.on_worker_result(request))

    def report_exit(self, report: ExitReport) -> ExitAnswer:
        """See :meth:`JobRendezvous.report_exit`."""
        worker = WorkerId(report.hostname, report.local_rank)
        self._check_worker(worker)
        seen = self._tell_listener(lambda it: it.on_worker_exit_seen(worker, report.exit_code))
        return seen or ExitAnswer(restart=False)

    def reported_result(self, worker: WorkerId) -> WorkerState | None:
        """See :meth:`JobRendezvous.reported_result`."""
        return self._workers.entry(worker).result

    def report_progress(self, request: ProgressRequest) -> None:
        """See :meth:`JobRendezvous.report_progress`."""
        self._check_round(request.round)
        self._progress = request
        self._tell_listener(lambda listener: listener.on_progress(request))

    def report_heartbeat(self, request: HeartbeatRequest) -> None:
        """See :meth:`JobRendezvous.report_heartbeat`."""
        worker = WorkerId(request.hostname, request.local_rank)
        self._check_worker(worker)
        beat = probe_report(self._round, worker, request), request.pace, request.held_shards
        self._tell_listener(lambda listener: listener.on_worker_heartbeat(worker, *beat))

    def round_info(self) -> RoundInfo:
        """See :meth:`JobRendezvous.round_info`."""
        current = self._round
        return RoundInfo(
            job=self.job,
            round=self.current_round,
            size=0 if current is None else len(current.slots),
            hosts=() if current is None else current.hosts,
            latest_notice_seq=self._notices.latest_seq,
            progress=self._progress,
        )

    # ---- listener ----------------------------------------------------------------------

    def refuse_incompatible(self, message: str) -> None:
        """A worker of the job was refused for its protocol version: the driver hears why."""
        self._tell_listener(lambda listener: listener.on_incompatible_worker(message))

    def _tell_listener(self, call: Callable[[RendezvousListener], T]) -> T | None:
        """Make one call of the listener, return its answer; a failing one (its traceback
        says which call) is logged, answers None, and never fails the request."""
        try:
            return call(self._listener)
        except Exception:
            logger.exception("job %s: a call of its listener failed", self.job)
            return None
