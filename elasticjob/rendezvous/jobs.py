"""The in-memory rendezvous state of one job, with asyncio long-polls."""

from __future__ import annotations

import asyncio
import collections
import hmac
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from pydantic import TypeAdapter, ValidationError

from elasticjob.rendezvous.api import JobRendezvous, RendezvousError, RendezvousListener
from elasticjob.rendezvous.wakeup import Wakeup
from elasticjob.wire import (
    HeartbeatRequest,
    JobName,
    Notice,
    NoticeKind,
    NoticesResponse,
    ProgressRequest,
    RendezvousRequest,
    RendezvousResponse,
    RendezvousStatus,
    ResultRequest,
    RoundInfo,
    SlotInfo,
    WorkerId,
)

logger = logging.getLogger(__name__)

MAX_NOTICES: Final = 1000
"""How many of its most recent notices a job keeps."""

_JOB_NAME: Final = TypeAdapter(JobName)


def _validate_job_name(job: str) -> None:
    """Raise :class:`ValueError` unless ``job`` is a valid job name."""
    try:
        _JOB_NAME.validate_python(job)
    except ValidationError as exc:
        raise ValueError(f"invalid job name {job!r}: must be a Kubernetes object name") from exc


def _validate_token(token: str) -> None:
    if not token or not token.isascii() or not token.isprintable() or " " in token:
        raise ValueError("a job token must be non-empty printable ASCII without spaces")


@dataclass(frozen=True)
class _Endpoint:
    address: str
    store_port: int


@dataclass(frozen=True)
class _Round:
    number: int
    slots: Mapping[WorkerId, SlotInfo]
    store: _Endpoint | None
    """None for an adopted round: its members formed their group before this process ran."""
    notice_seq: int
    sync: bool


def _check_slots(slots: Mapping[WorkerId, SlotInfo]) -> WorkerId:
    """Return the rank-0 member, or raise if the slots are not ranks ``0..size-1``."""
    by_rank: dict[int, WorkerId] = {}
    for worker, slot in slots.items():
        if (slot.hostname, slot.local_rank) != (worker.hostname, worker.local_rank):
            raise RendezvousError(f"slot of {worker} names {slot.hostname}[{slot.local_rank}]")
        if slot.size != len(slots):
            raise RendezvousError(f"slot of {worker} has size {slot.size}, round has {len(slots)}")
        if slot.rank in by_rank:
            raise RendezvousError(f"rank {slot.rank} given to {by_rank[slot.rank]} and {worker}")
        by_rank[slot.rank] = worker
    missing = sorted(set(range(len(slots))) - by_rank.keys())
    if not slots or missing:
        raise RendezvousError(f"round must give every rank 0..size-1 once; missing {missing}")
    return by_rank[0]


class InMemoryJobRendezvous(JobRendezvous):
    """:class:`JobRendezvous` kept in memory, for one job on one event loop.

    Raises :class:`ValueError` if ``job`` is not a valid job name or ``token`` is empty or not
    printable ASCII without spaces (it travels in an ``Authorization: Bearer`` header).
    """

    def __init__(self, job: str, token: str, listener: RendezvousListener) -> None:
        _validate_job_name(job)
        _validate_token(token)
        self.job = job
        self._token = token.encode("ascii")
        self._listener = listener
        self._endpoints: dict[WorkerId, _Endpoint] = {}
        self._announced: dict[WorkerId, set[int]] = {}
        self._dismissed: set[WorkerId] = set()
        self._round: _Round | None = None
        self._finished: str | None = None
        self._closing = False
        self._notices: collections.deque[Notice] = collections.deque(maxlen=MAX_NOTICES)
        self._latest_seq = 0
        self._progress: ProgressRequest | None = None
        self._round_changed = Wakeup()
        self._notice_posted = Wakeup()

    def check_token(self, token: str) -> bool:
        """Whether ``token`` is this job's token (compared in constant time)."""
        return hmac.compare_digest(self._token, token.encode("utf-8", "surrogatepass"))

    @property
    def finished(self) -> bool:
        """Whether :meth:`finish` was called."""
        return self._finished is not None

    def close_waits(self) -> None:
        """Answer every pending long-poll now, as if its wait had run out, and make later
        requests answer without waiting (the service is shutting down)."""
        self._closing = True
        self._round_changed.fire()
        self._notice_posted.fire()

    # ---- driver side -------------------------------------------------------------------

    def publish_round(
        self, round_number: int, slots: Mapping[WorkerId, SlotInfo], *, sync: bool
    ) -> None:
        """See :meth:`JobRendezvous.publish_round`. Also raises :class:`RendezvousError` if
        ``round_number`` is not newer than the current round or the slots are not ranks
        ``0..size-1`` exactly once (each slot naming its worker). Members that were dismissed
        are admitted again."""
        if round_number <= self.current_round:
            raise RendezvousError(
                f"job {self.job}: round {round_number} is not newer than {self.current_round}"
            )
        rank0 = _check_slots(slots)
        store = self._endpoints.get(rank0)
        if store is None:
            raise RendezvousError(f"job {self.job}: rank-0 member {rank0} has not registered")
        self._round = _Round(round_number, dict(slots), store, self._latest_seq, sync)
        self._dismissed.difference_update(slots)
        logger.info(
            "job %s: round %d published with %d members", self.job, round_number, len(slots)
        )
        self._round_changed.fire()

    def dismiss(self, workers: Iterable[WorkerId]) -> None:
        """See :meth:`JobRendezvous.dismiss`."""
        dismissed = set(workers)
        if not dismissed:
            return
        self._dismissed.update(dismissed)
        for worker in dismissed:
            self._announced.pop(worker, None)
        logger.info("job %s: dismissed %s", self.job, ", ".join(map(str, sorted(dismissed))))
        self._round_changed.fire()

    def adopt(self, round_number: int, slots: Mapping[WorkerId, SlotInfo], notice_seq: int) -> None:
        """See :meth:`JobRendezvous.adopt`."""
        if self._round is not None:
            raise RendezvousError(
                f"job {self.job}: cannot adopt a round after round {self.current_round}"
            )
        _check_slots(slots)
        self._latest_seq = max(self._latest_seq, notice_seq)
        self._round = _Round(round_number, dict(slots), None, self._latest_seq, False)
        logger.info("job %s: adopted round %d with %d members", self.job, round_number, len(slots))

    def readmit(self, workers: Iterable[WorkerId]) -> None:
        """See :meth:`JobRendezvous.readmit`."""
        for worker in workers:
            self._dismissed.discard(worker)
            self._announced.pop(worker, None)

    def post_notice(self, kind: NoticeKind, hosts: Iterable[str] = ()) -> Notice:
        """See :meth:`JobRendezvous.post_notice`. Raises :class:`RendezvousError` if a host is
        not a valid host name. Only the last :data:`MAX_NOTICES` notices are kept."""
        try:
            notice = Notice(
                seq=self._latest_seq + 1, kind=kind, round=self.current_round, hosts=tuple(hosts)
            )
        except ValidationError as exc:
            raise RendezvousError(f"job {self.job}: invalid notice: {exc}") from exc
        self._latest_seq = notice.seq
        self._notices.append(notice)
        logger.info("job %s: notice %d %s %s", self.job, notice.seq, kind, notice.hosts)
        self._notice_posted.fire()
        return notice

    def finish(self, message: str) -> None:
        """See :meth:`JobRendezvous.finish`. Pending notice long-polls are answered too, and
        later ones do not wait. Finishing again keeps the first message."""
        if self._finished is None:
            self._finished = message
            logger.info("job %s: finished: %s", self.job, message)
        self._round_changed.fire()
        self._notice_posted.fire()

    @property
    def current_round(self) -> int:
        """See :attr:`JobRendezvous.current_round`."""
        return 0 if self._round is None else self._round.number

    @property
    def current_slots(self) -> Mapping[WorkerId, SlotInfo]:
        """See :attr:`JobRendezvous.current_slots`."""
        return {} if self._round is None else dict(self._round.slots)

    # ---- worker side -------------------------------------------------------------------

    async def rendezvous(self, request: RendezvousRequest) -> RendezvousResponse:
        """See :meth:`JobRendezvous.rendezvous`. Answers at once, in this order of precedence:
        ``FINISHED`` once the job has finished, ``REMOVED`` for a dismissed worker (neither of
        these registers the worker or tells the listener), ``ASSIGNED`` when the worker is a
        member of a round newer than ``after_round``."""
        worker = WorkerId(request.hostname, request.local_rank)
        if self._finished is None and worker not in self._dismissed:
            self._endpoints[worker] = _Endpoint(request.address, request.store_port)
            announced = self._announced.setdefault(worker, set())
            if request.after_round not in announced:
                announced.add(request.after_round)
                self._tell_listener(
                    "on_worker_ready",
                    lambda: self._listener.on_worker_ready(
                        worker, request.after_round, rolled_back=request.rolled_back
                    ),
                )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request.wait_seconds
        while True:
            answer = self._answer(worker, request.after_round)
            remaining = deadline - loop.time()
            if answer is not None:
                return answer
            if remaining <= 0 or self._closing:
                return RendezvousResponse(status=RendezvousStatus.PENDING)
            await self._round_changed.wait(remaining)

    def _answer(self, worker: WorkerId, after_round: int) -> RendezvousResponse | None:
        if self._finished is not None:
            return RendezvousResponse(status=RendezvousStatus.FINISHED, message=self._finished)
        if worker in self._dismissed:
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
        )

    async def notices(self, after_seq: int, wait_seconds: float) -> NoticesResponse:
        """See :meth:`JobRendezvous.notices`. Does not wait once the job has finished. A
        client asking after a sequence number that is no longer kept gets every kept notice
        newer than it (``latest_seq`` tells it how far the log has gone)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_seconds
        while True:
            found = tuple(n for n in self._notices if n.seq > after_seq)
            remaining = deadline - loop.time()
            if found or remaining <= 0 or self._closing or self._finished is not None:
                return NoticesResponse(notices=found, latest_seq=self._latest_seq)
            await self._notice_posted.wait(remaining)

    def report_result(self, request: ResultRequest) -> None:
        """See :meth:`JobRendezvous.report_result`."""
        worker = WorkerId(request.hostname, request.local_rank)
        logger.info("job %s: %s reported %s", self.job, worker, request.state)
        self._tell_listener("on_worker_result", lambda: self._listener.on_worker_result(request))

    def report_progress(self, request: ProgressRequest) -> None:
        """See :meth:`JobRendezvous.report_progress`."""
        self._progress = request
        self._tell_listener("on_progress", lambda: self._listener.on_progress(request))

    def report_heartbeat(self, request: HeartbeatRequest) -> None:
        """See :meth:`JobRendezvous.report_heartbeat`."""
        worker = WorkerId(request.hostname, request.local_rank)
        self._tell_listener(
            "on_worker_heartbeat", lambda: self._listener.on_worker_heartbeat(worker)
        )

    def round_info(self) -> RoundInfo:
        """See :meth:`JobRendezvous.round_info`."""
        slots = sorted(self.current_slots.values(), key=lambda slot: slot.rank)
        return RoundInfo(
            job=self.job,
            round=self.current_round,
            size=len(slots),
            hosts=tuple(dict.fromkeys(slot.hostname for slot in slots)),
            latest_notice_seq=self._latest_seq,
            progress=self._progress,
        )

    # ---- listener ----------------------------------------------------------------------

    def _tell_listener(self, what: str, call: Callable[[], None]) -> None:
        """Run one listener call; a failing listener is logged, never fails the request."""
        try:
            call()
        except Exception:
            logger.exception("job %s: listener %s failed", self.job, what)
