"""The rendezvous protocol's messages: the request and response bodies the service and the
worker runtime exchange, and the names they carry (hosts, jobs, slots, workers).

Every request body the rendezvous service accepts is one of the ``*Request`` models below,
parsed with :func:`~elasticjob.wire.strict_json.parse_json` (strict, see
:mod:`elasticjob.wire.strict_json`). The protocol's version and the bounds of these messages
are in :mod:`elasticjob.wire.protocol`.
"""

from __future__ import annotations

import enum
import signal
from typing import Annotated, NamedTuple

from pydantic import Field, StrictBool, StringConstraints, model_validator

from elasticjob.wire.protocol import (
    MAX_EXIT_REASON_CHARS,
    MAX_HELD_COPIES,
    MAX_PROBE_TARGETS,
    MAX_REPORTED_CHECKPOINTS,
    MAX_REPORTED_COMMITS,
)
from elasticjob.wire.strict_json import StrictModel

HostName = Annotated[
    str, StringConstraints(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9]([A-Za-z0-9.\-_]*)$")
]
"""A host as discovery names it: a DNS name, a pod name or an IPv4 address."""

JobName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=253, pattern=r"^[a-z0-9]([a-z0-9.\-]*[a-z0-9])?$"),
]
"""A job's name: a Kubernetes object name (``namespace.name`` for the operator)."""

LocalRank = Annotated[int, Field(strict=True, ge=0, le=1023)]
Port = Annotated[int, Field(strict=True, ge=1, le=65535)]
RoundNumber = Annotated[int, Field(strict=True, ge=0)]


class WorkerId(NamedTuple):
    """A worker process: the host it runs on and its slot (local rank) there."""

    hostname: str
    local_rank: int

    def __str__(self) -> str:
        return f"{self.hostname}[{self.local_rank}]"


class WorkerState(enum.StrEnum):
    """What a worker reported for a round (Horovod's READY / SUCCESS / FAILURE)."""

    READY = "READY"
    """Waiting for the next round (after a failure or a hosts-updated notice, or at start)."""
    SUCCESS = "SUCCESS"
    """The training function returned; the process exits 0."""
    FAILURE = "FAILURE"
    """The process failed (non-zero exit, crash, lost pod)."""


class NoticeKind(enum.StrEnum):
    """Kinds of notice the driver posts to a job's workers."""

    HOSTS_ADDED = "HOSTS_ADDED"
    """New workers are registered and ready to join: survivors should re-form the group."""
    HOSTS_REMOVED = "HOSTS_REMOVED"
    """Hosts will leave (scale-in, preemption): every worker should re-form the group; the
    workers on the named hosts then exit without being counted as failures."""
    ROUND_FAILED = "ROUND_FAILED"
    """A member of the named round failed: its group is broken, abort it now instead of
    waiting for a collective timeout."""
    SUSPEND = "SUSPEND"
    """The job is being suspended: every rank stops at the same step, as for a host update,
    writes its last commit as a durable checkpoint (where the job has a checkpoint policy)
    and asks for the next round, which the driver answers by ending the job's run."""


class Notice(StrictModel):
    """One entry of a job's notice log. ``seq`` is strictly increasing per job."""

    seq: Annotated[int, Field(strict=True, ge=1)]
    kind: NoticeKind
    round: RoundNumber
    """The round the notice is about (the round in force when it was posted)."""
    hosts: tuple[HostName, ...] = ()


class NoticesResponse(StrictModel):
    notices: tuple[Notice, ...]
    latest_seq: Annotated[int, Field(strict=True, ge=0)]


class SlotInfo(StrictModel):
    """A worker's place in one round (Horovod's SlotInfo)."""

    hostname: HostName
    rank: Annotated[int, Field(strict=True, ge=0)]
    local_rank: LocalRank
    cross_rank: Annotated[int, Field(strict=True, ge=0)]
    size: Annotated[int, Field(strict=True, ge=1)]
    local_size: Annotated[int, Field(strict=True, ge=1)]
    cross_size: Annotated[int, Field(strict=True, ge=1)]


class RendezvousStatus(enum.StrEnum):
    ASSIGNED = "ASSIGNED"
    """The worker is a member of ``round`` with ``slot``."""
    REMOVED = "REMOVED"
    """The worker is not part of the job any more; it must exit 0 (not a failure)."""
    PENDING = "PENDING"
    """No round for this worker yet within the request's wait; ask again."""
    FINISHED = "FINISHED"
    """The job has ended; the worker must exit."""


class ScriptExit(StrictModel):
    """How a worker's script failed on its own (it was not stopped for the job): its return
    code (negative: the signal that killed it) and its last lines. The one wire form of a
    script's failure: a restart-mode worker's agent sends it with its request for the next
    round (:attr:`RendezvousRequest.script_exit`), an elastic worker whose script raised with
    its result (:attr:`ResultRequest.script_exit`); the driver judges both with one rule."""

    exit_code: Annotated[int, Field(strict=True, ge=-255, le=255)]
    log_tail: Annotated[str, StringConstraints(max_length=4096)] = ""

    def status(self) -> str:
        """``exit code N``, or ``killed by SIGNAME``."""
        if self.exit_code >= 0:
            return f"exit code {self.exit_code}"
        try:
            return f"killed by {signal.Signals(-self.exit_code).name}"
        except ValueError:
            return f"killed by signal {-self.exit_code}"


class HeldShards(StrictModel):
    """What a worker holds of the last confirmed commit of a sharded state: of ``shards`` shards (in
    each replica), its own, ``own``, and copies of ``copies``. With ``hsdp``, the state is
    HSDP, whose replicas each hold every shard; otherwise FSDP over every rank, where ``own``
    is the worker's rank in the round that made the commit. The driver places a
    one-dimensional state's newcomers among the survivors so that the fewest rows move
    (``elasticjob.driver.rank_placement``), and plans what follows a lost slot of a host
    that lives on (``elasticjob.driver.slot_loss``)."""

    shards: Annotated[int, Field(strict=True, ge=1, le=1 << 20)]
    own: Annotated[int, Field(strict=True, ge=0)]
    copies: Annotated[
        tuple[Annotated[int, Field(strict=True, ge=0)], ...], Field(max_length=MAX_HELD_COPIES)
    ] = ()
    hsdp: Annotated[bool, Field(strict=True)] = False

    @model_validator(mode="after")
    def _shards_exist(self) -> HeldShards:
        held = [self.own, *self.copies]
        if max(held) >= self.shards:
            raise ValueError(f"shards {held} are not all among {self.shards} shards")
        if len(set(held)) != len(held):
            raise ValueError(f"shards {held} are named twice (own first, then copies)")
        return self

    @property
    def held(self) -> tuple[int, ...]:
        """Every shard it holds: its own and its copies."""
        return (self.own, *self.copies)


class RendezvousRequest(StrictModel):
    """A worker is READY for a round newer than ``after_round`` (0: it has never had one)."""

    hostname: HostName
    local_rank: LocalRank
    address: HostName
    """The address the worker binds to (its host's address or pod IP)."""
    store_port: Port
    """Port of the TCPStore server the worker hosts; used when it becomes rank 0."""
    probe_port: Port | None = None
    """Port of the listener its peers probe (None: a worker without one, a restart-mode agent,
    which nobody probes)."""
    after_round: RoundNumber = 0
    wait_seconds: Annotated[float, Field(strict=True, ge=0, le=60, allow_inf_nan=False)] = 30.0
    rolled_back: StrictBool = False
    """The worker left round ``after_round`` after a collective failed on it and rolled its
    state back to its last commit: the driver fails that round and re-syncs the next. Only
    that: a script's own failure is ``script_exit``."""
    script_exit: ScriptExit | None = None
    """A restart-mode worker: its script failed on its own in round ``after_round``, and how:
    the driver fails that round."""
    suspended: StrictBool = False
    """The worker stopped for a suspension with its state saved: its last commit is a durable
    checkpoint where the job has a checkpoint folder, or its restart-mode script was stopped.
    A member that stops without it stopped for another notice, or failed to
    write: the driver lets the next round form and tells it again."""
    held_shards: HeldShards | None = None
    """What the worker holds of a one-dimensional sharded state's last commit (None: it
    holds none, or its state is not sharded over every rank)."""


class PeerEndpoint(StrictModel):
    """A member of the round that a worker probes: who it is and the endpoint it registered
    with. A TCP connect to its probe listener is the probe."""

    hostname: HostName
    local_rank: LocalRank
    address: HostName
    store_port: Port
    """Its TCPStore server's port. Never probed: a store server can stall for seconds on
    connections that close without a request."""
    probe_port: Port | None = None
    """Its probe listener's port, the one probed (None: a worker without one, which is not
    probed)."""


class RendezvousResponse(StrictModel):
    status: RendezvousStatus
    round: RoundNumber = 0
    slot: SlotInfo | None = None
    store_address: HostName | None = None
    store_port: Port | None = None
    notice_seq: Annotated[int, Field(strict=True, ge=0)] = 0
    """The job's latest notice sequence number when the round was published: notices up to it
    are already accounted for by this round, so members start counting host updates from it."""
    sync: StrictBool = True
    """Whether state must be broadcast from rank 0 after forming the group. False only when
    every member kept identical live state (a graceful removal); the driver decides it once
    for the whole round, so ranks can never disagree on it."""
    peers: Annotated[tuple[PeerEndpoint, ...], Field(max_length=MAX_PROBE_TARGETS)] = ()
    """The members this worker probes when one of its collectives of the round blocks
    (ASSIGNED only)."""
    message: str = ""


class ResultRequest(StrictModel):
    """A worker's final report for its process: ``SUCCESS``, or ``FAILURE`` with how its
    script failed on its own (``script_exit``: an elastic script that raised reports exit
    code 1 and the exception)."""

    hostname: HostName
    local_rank: LocalRank
    state: WorkerState
    script_exit: ScriptExit | None = None
    """With ``FAILURE`` only, and required there."""

    @model_validator(mode="after")
    def _failure_says_how(self) -> ResultRequest:
        if (self.state is WorkerState.FAILURE) != (self.script_exit is not None):
            raise ValueError("script_exit comes with a FAILURE result, and only with one")
        return self


class ExitReport(StrictModel):
    """A pod's slot supervisor saw the process of one of its slots end, with ``exit_code``
    (negative: the signal that killed it): the driver need not wait for the pod's status,
    or for the process's peers to miss it, to fail its round."""

    hostname: HostName
    local_rank: LocalRank
    exit_code: Annotated[int, Field(strict=True, ge=-255, le=255)]


class ExitAnswer(StrictModel):
    """What the pod does about its slot's end (:class:`ExitReport`): with ``restart``, the
    driver keeps the pod and its other slots, and the supervisor starts a fresh process in
    the slot (``elasticjob.driver.slot_loss``); otherwise the supervisor takes the other
    slots down and the pod fails, as it does when nobody answers."""

    restart: bool
    reason: Annotated[str, StringConstraints(max_length=MAX_EXIT_REASON_CHARS)] = ""


class ProbedPeer(StrictModel):
    """A peer a worker could not reach (see :class:`HeartbeatRequest`)."""

    hostname: HostName
    local_rank: LocalRank


class StepPace(StrictModel):
    """How long a worker's recent steps of ``round`` kept it busy: the median, over its last
    steps, of a step's wall time less the time it waited in the step's collectives (the
    straggler of a synchronous job waits least). Sent with its heartbeats; the driver flags
    a member consistently slower than the others (``elasticjob.driver.stragglers``)."""

    round: RoundNumber
    steps: Annotated[int, Field(strict=True, ge=0)]
    """Steps measured in the round so far."""
    busy_s: Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]


class HeartbeatRequest(StrictModel):
    """A worker process is alive. Sent by a background thread every heartbeat interval,
    whatever the training thread does, so only a frozen or cut-off process stops sending.

    While one of its collectives of ``round`` has blocked for the probe threshold (see
    :data:`~elasticjob.worker_contract.ENV_PROBE_AFTER`), the worker probes the peers the
    round gave it (:attr:`RendezvousResponse.peers`) before each beat and sends the result:
    ``round`` and the peers it could not reach in ``unreachable`` (empty: it reached them
    all). Both are absent otherwise. The driver kills a member a majority of its probers
    cannot reach (``elasticjob.driver.partition``)."""

    hostname: HostName
    local_rank: LocalRank
    round: RoundNumber | None = None
    """The round whose collective blocks (None: no probe report with this beat)."""
    unreachable: Annotated[tuple[ProbedPeer, ...], Field(max_length=MAX_PROBE_TARGETS)] = ()
    """The probed peers that did not answer; given only with ``round``."""
    pace: StepPace | None = None
    """Its recent steps' pace (None: it has measured no step of its round yet)."""
    held_shards: HeldShards | None = None
    """What it holds of its sharded state's last confirmed commit now (None: nothing, or no sharded
    state)."""

    @model_validator(mode="after")
    def _report_names_its_round(self) -> HeartbeatRequest:
        if self.round is None and self.unreachable:
            raise ValueError("unreachable peers are reported with the round they belong to")
        if len(set(self.unreachable)) != len(self.unreachable):
            raise ValueError("a peer is reported unreachable more than once")
        return self


_NonNegativeFloat = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
_NonNegativeInt = Annotated[int, Field(strict=True, ge=0)]


class CheckpointReport(StrictModel):
    """A durable checkpoint of the committed state, written or loaded by rank 0."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=253)]
    """The checkpoint's name in the job's checkpoint folder."""
    epoch: _NonNegativeInt
    step: _NonNegativeInt
    """The runtime's step count at the commit the checkpoint holds."""
    seconds: _NonNegativeFloat
    """How long writing (or loading) it took, copy to disk included."""
    size_bytes: _NonNegativeInt


class ProgressRequest(StrictModel):
    """Training progress that rank 0 reports (shown in the job's status and the metrics)."""

    round: RoundNumber
    epoch: Annotated[int, Field(strict=True, ge=0)]
    step: Annotated[int, Field(strict=True, ge=0)]
    samples_per_second: _NonNegativeFloat = 0.0
    resumed: Annotated[bool, Field(strict=True)] = False
    """Training (re)starts in ``round`` now: its state is synced and the first step is next
    (the end of a recovery or of a resize)."""
    commit_seconds: Annotated[
        tuple[_NonNegativeFloat, ...], Field(max_length=MAX_REPORTED_COMMITS)
    ] = ()
    """How long each commit since the previous report took."""
    checkpoints: Annotated[
        tuple[CheckpointReport, ...], Field(max_length=MAX_REPORTED_CHECKPOINTS)
    ] = ()
    """The checkpoints completed since the previous report."""
    restored_from: CheckpointReport | None = None
    """The checkpoint this round's rank 0 loaded because no worker of the previous round
    survived (sent with ``resumed``)."""
    committed_step: _NonNegativeInt | None = None
    """The runtime's step count at rank 0's newest commit (``step`` is the script's own
    number when it reports progress): a durable fallback loses the steps between this and the
    checkpoint it loads."""


class RoundInfo(StrictModel):
    """A job's current round, as ``GET /v1/jobs/{job}/round`` returns it."""

    job: str
    round: RoundNumber
    size: Annotated[int, Field(strict=True, ge=0)]
    hosts: tuple[HostName, ...]
    latest_notice_seq: Annotated[int, Field(strict=True, ge=0)]
    progress: ProgressRequest | None = None


class PlannedRound(StrictModel):
    """The round the driver plans next while the workers it adds start
    (``GET /v1/jobs/{job}/plan``): a worker added to a running job takes its tentative place
    from it at ``init()``. Round 0 without slots: nothing is planned. (A worker that cannot
    get it estimates its place.)"""

    round: RoundNumber = 0
    slots: tuple[SlotInfo, ...] = ()


class ErrorResponse(StrictModel):
    error: str
    detail: list[dict[str, object]] | str | None = None
