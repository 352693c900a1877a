"""Small abstract types of the rendezvous service.

One service process serves many jobs. Each job has a :class:`JobRendezvous`: the in-memory
state of its rounds and notices, driven by that job's driver (through the methods under
"driver side") and read by its workers over HTTP (``server.py``; the HTTP API is documented
in ``docs/rendezvous-api.yaml``). A :class:`RendezvousListener` (the job's driver) hears about
what workers do.

Everything runs on one asyncio event loop; none of these methods is thread-safe.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from elasticjob.wire.messages import (
    ExitAnswer,
    ExitReport,
    HeartbeatRequest,
    HeldShards,
    Notice,
    NoticeKind,
    NoticesResponse,
    PlannedRound,
    ProgressRequest,
    RendezvousRequest,
    RendezvousResponse,
    ResultRequest,
    RoundInfo,
    ScriptExit,
    SlotInfo,
    StepPace,
    WorkerId,
    WorkerState,
)


class RendezvousError(RuntimeError):
    """A driver-side misuse of a job's rendezvous (for example publishing a round whose
    rank 0 never registered)."""


class Refusal(enum.Enum):
    """Why a job refused a worker's request (nothing of the job changed)."""

    UNKNOWN_WORKER = "unknown worker"
    """The driver did not launch (or readmit) a process for this worker."""
    NOT_ADMITTED_YET = "not admitted yet"
    """As UNKNOWN_WORKER, but the job has not published a round of its own yet (it may have
    adopted one after a restart): the worker may be one its driver takes back shortly, so it
    should retry."""
    FUTURE_ROUND = "future round"
    """The request names a round newer than the newest the job has published."""
    ENDPOINT_CHANGED = "endpoint changed"
    """The worker registered again for the same round with another store endpoint."""
    RESULT_REPEATED = "result repeated"
    """The worker's process already reported its result."""
    TOO_MANY_WAITS = "too many waits"
    """The job holds as many long-polls as its bounds allow."""
    TOO_MANY_BODIES = "too many bodies"
    """The job has as many request bodies being read as its bounds allow."""
    INVALID_REPORT = "invalid report"
    """A probe report names a peer the worker does not probe in that round."""


@dataclass(frozen=True)
class ProbeReport:
    """What a member of ``round`` found when it probed its peers (see
    ``elasticjob.rendezvous.probes``): the ones it could not reach (empty: it reached all).

    The job validates a report against its round and hands it to the listener with the
    heartbeat that carried it; the driver keeps each worker's latest beside its last beat,
    timed by the driver's clock like the beat (the job keeps none: a report only means
    something together with the beat's freshness, and the round's end makes it moot)."""

    round: int
    unreachable: frozenset[WorkerId]


class RequestRefused(Exception):
    """A job refused a worker's request; ``refusal`` says why, the message names the worker."""

    def __init__(self, refusal: Refusal, message: str) -> None:
        super().__init__(message)
        self.refusal = refusal


class RendezvousListener(Protocol):
    """What a job's driver hears from its workers, and what the job asks of the driver about
    them. Called on the event loop; must not block."""

    def is_dismissed(self, worker: WorkerId) -> bool:
        """Whether the driver told ``worker`` to exit (its one keeper of that fact): its
        requests for a round are answered ``REMOVED``."""

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
        """``worker`` waits for a round newer than ``after_round`` (called once per
        (worker, after_round): a long-poll that is retried does not call it again);
        ``rolled_back``: it rolled its state back after a collective failed on it;
        ``script_exit``: a restart-mode worker's script failed on its own, and how;
        ``suspended``: it saved its state for a suspension; ``held_shards``: what it holds
        of a sharded state's last confirmed commit."""

    def on_worker_result(self, request: ResultRequest) -> None:
        """The worker reported how its process ended."""

    def on_worker_exit_seen(self, worker: WorkerId, exit_code: int) -> ExitAnswer:
        """``worker``'s pod (its slot supervisor) saw its process end with ``exit_code``;
        the answer says whether the pod restarts that slot and keeps its others."""

    def on_progress(self, progress: ProgressRequest) -> None:
        """Rank 0 reported training progress."""

    def on_incompatible_worker(self, message: str) -> None:
        """A worker of the job (its token valid) speaks another rendezvous protocol: its
        image is another release's, and the job cannot run as it is (``message`` says so)."""

    def on_worker_heartbeat(
        self,
        worker: WorkerId,
        report: ProbeReport | None,
        pace: StepPace | None,
        held_shards: HeldShards | None,
    ) -> None:
        """The worker's process is alive (it beats every heartbeat interval). ``report``:
        what it found probing its peers of the current round while a collective blocked
        (validated against the round), or None (no report, or one of an older round).
        ``pace``: how busy its recent steps kept it (None: none measured in its round).
        ``held_shards``: what it holds of its sharded state's last confirmed commit now."""


class JobRendezvous(abc.ABC):
    """The rendezvous state of one job."""

    job: str

    # ---- driver side -------------------------------------------------------------------

    @abc.abstractmethod
    def publish_round(
        self, round_number: int, slots: Mapping[WorkerId, SlotInfo], *, sync: bool
    ) -> None:
        """Make ``round_number`` (strictly greater than the current round) current with the
        given members. Every member waiting in :meth:`rendezvous` (and every later request of a
        member with ``after_round < round_number``) gets ``ASSIGNED`` with its slot, the store
        endpoint of the rank-0 member (the address and store port it registered with), the
        latest notice sequence number and ``sync``. Raises :class:`RendezvousError` if the
        rank-0 member has not registered."""

    @abc.abstractmethod
    def plan_next(self, round_number: int, slots: Mapping[WorkerId, SlotInfo]) -> None:
        """Tell workers being added what round the driver plans with them: until a round is
        published, :meth:`planned_round` answers these slots (tentative: the round formed may
        differ if something else changes meanwhile)."""

    @abc.abstractmethod
    def dismiss(self, workers: Iterable[WorkerId]) -> None:
        """The driver dismissed these workers (:meth:`RendezvousListener.is_dismissed` says so
        from now on): answer their pending rendezvous requests now; they and later ones get
        ``REMOVED`` (the workers exit 0, which is not a failure)."""

    @abc.abstractmethod
    def adopt(self, round_number: int, slots: Mapping[WorkerId, SlotInfo], notice_seq: int) -> None:
        """Take over a round that is already running (after the service restarted): make it
        current without any registration, and continue numbering notices after
        ``notice_seq``, so members that kept training keep hearing notices."""

    @abc.abstractmethod
    def continue_after(self, round_number: int) -> None:
        """Number this job's rounds on after ``round_number``, with none in force (a suspended
        job resumes: its new run's first round is ``round_number + 1``)."""

    @abc.abstractmethod
    def readmit(self, workers: Iterable[WorkerId]) -> None:
        """A new process is about to run for each of these workers: admit them (requests of
        workers that were never admitted, nor members of a published or adopted round, are
        refused) with a fresh entry, forgetting what the previous process registered,
        announced and reported, so the new process is heard."""

    @abc.abstractmethod
    def post_notice(self, kind: NoticeKind, hosts: Iterable[str] = ()) -> Notice:
        """Append a notice (about the current round) with the next sequence number and wake
        every long-poll waiting for notices."""

    @abc.abstractmethod
    def finish(self, message: str) -> None:
        """The job has ended: every pending and later rendezvous request gets ``FINISHED``."""

    @property
    @abc.abstractmethod
    def current_round(self) -> int:
        """The round in force (0 before the first is published; see :meth:`continue_after`)."""

    @property
    @abc.abstractmethod
    def current_slots(self) -> Mapping[WorkerId, SlotInfo]:
        """Members of the current round."""

    @property
    @abc.abstractmethod
    def progress(self) -> ProgressRequest | None:
        """Rank 0's latest progress report (None: none yet); its one keeper."""

    # ---- worker side (called by the HTTP layer after authentication and validation) ----

    @abc.abstractmethod
    async def rendezvous(self, request: RendezvousRequest) -> RendezvousResponse:
        """Register the worker as READY for a round newer than ``request.after_round`` and
        wait up to ``request.wait_seconds`` for it; ``PENDING`` if none came in time.
        Raises :class:`RequestRefused` (changing nothing) for a worker the driver did not
        launch, an ``after_round`` newer than the current round, or another store endpoint
        than the worker registered with for the same ``after_round``."""

    @abc.abstractmethod
    async def notices(self, after_seq: int, wait_seconds: float) -> NoticesResponse:
        """Notices with ``seq > after_seq``, waiting up to ``wait_seconds`` for one."""
        # Implementations that bound the long-polls they hold raise RequestRefused beyond it.

    @abc.abstractmethod
    def report_result(self, request: ResultRequest) -> None:
        """Record a worker's result and tell the listener. Raises :class:`RequestRefused` for
        a worker the driver did not launch or a second result of the same process."""

    @abc.abstractmethod
    def report_exit(self, report: ExitReport) -> ExitAnswer:
        """Tell the listener that a worker's pod saw its process end, and return what the pod
        is to do (without a listener's answer: take the pod down). Raises
        :class:`RequestRefused` for a worker the driver did not launch."""

    @abc.abstractmethod
    def reported_result(self, worker: WorkerId) -> WorkerState | None:
        """The state the worker's process reported with its result (None: none yet); its one
        keeper."""

    @abc.abstractmethod
    def report_progress(self, request: ProgressRequest) -> None:
        """Record rank 0's progress and tell the listener. Raises :class:`RequestRefused` for
        a round newer than the current one."""

    @abc.abstractmethod
    def report_heartbeat(self, request: HeartbeatRequest) -> None:
        """Tell the listener that the worker's process is alive, with its probe report if it
        sent one for the current round (a report of an older round is dropped: the beat still
        counts). Raises :class:`RequestRefused` (changing nothing) for a worker the driver
        did not launch, a report of a round newer than the current one, and a report naming
        a peer the worker does not probe in the round."""

    @abc.abstractmethod
    def planned_round(self) -> PlannedRound:
        """The round :meth:`plan_next` planned, if none was published since (else empty)."""

    @abc.abstractmethod
    def round_info(self) -> RoundInfo:
        """The current round, its members' hosts, the latest notice and progress."""
