"""Wire types shared by the driver, the rendezvous service and the worker runtime.

This module is the only code the two sides of elasticjob have in common, so it imports
neither torch nor kopf nor aiohttp: pydantic models and enums only.

Every request body the rendezvous service accepts is one of the ``*Request`` models below,
parsed with :func:`parse_json`: the models are strict (an integer field takes a JSON integer
only, never ``true``, ``"1"`` or ``1.0``; a boolean takes ``true`` or ``false`` only; a float
field takes any JSON number), forbid unknown fields, bound every number, and a body that names
a key twice is refused, so malformed input is refused with a 4xx before it can touch any job's
state.
"""

from __future__ import annotations

import enum
import json
from typing import Annotated, Final, NamedTuple, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StringConstraints,
    model_validator,
)

API_PREFIX = "/v1"
"""Path prefix of every job-scoped endpoint of the rendezvous service."""

PROTOCOL_HEADER: Final = "X-Elasticjob-Protocol"
"""Header carrying the rendezvous protocol version: workers send theirs on every request and
the service answers with its own."""
PROTOCOL_VERSION: Final = 6
"""The rendezvous protocol this release speaks. Version 1 is that of the releases that sent no
:data:`PROTOCOL_HEADER` (a request without it is version 1). Version 2 added the header,
``429 Too Many Requests`` answers (a version-1 worker takes them as fatal), refusals of
workers the driver did not launch and of rounds not published yet, and strict bodies.
Version 3 added peer probes: :attr:`RendezvousResponse.peers` and the probe report of a
:class:`HeartbeatRequest`. Its request fields are optional, so a version-2 worker's requests
are valid version-3 requests; but a version-2 worker refuses any response field it does not
know (strict models), so the service leaves ``peers`` out of its answers to version 2.
``GET plan`` (:class:`PlannedRound`) came later without a new version: no older worker asks
for it, and a newer worker takes an older service's 404 as "no plan". Version 4 added the
optional :attr:`ProgressRequest.resumed` and :attr:`ProgressRequest.commit_seconds` (the
driver's recovery and commit metrics); a version-3 worker's reports stay valid. Version 5 added
the optional :attr:`ProgressRequest.checkpoints`, :attr:`ProgressRequest.restored_from`
and :attr:`ProgressRequest.committed_step` (durable checkpoints written and loaded, and the
committed steps a fallback loses); older workers' reports stay valid. Version 6 added the
optional :attr:`RendezvousRequest.probe_port` and :attr:`PeerEndpoint.probe_port`: peers are
probed on a listener of their own, not on their TCPStore server (the service leaves
``probe_port`` out of the peers it gives an older worker, which would refuse it)."""
MIN_PROTOCOL_VERSION: Final = 2
"""The oldest worker protocol this service accepts; an older (or newer) worker is refused
with ``426 Upgrade Required`` naming both versions, and exits with that message. Version-2
workers still train; they send no probe reports (see :data:`PROTOCOL_VERSION`)."""

MAX_PROBE_TARGETS: Final = 3
"""Most peers one worker probes in a round: rank 0 and its two neighbours in the ring of its
local rank across hosts (see ``elasticjob.rendezvous.probes``)."""

# Environment variables through which a launcher (or the operator) hands a worker its identity.
ENV_RENDEZVOUS_URL = "ELASTICJOB_RENDEZVOUS_URL"
ENV_JOB = "ELASTICJOB_JOB"
ENV_TOKEN = "ELASTICJOB_TOKEN"
ENV_HOSTNAME = "ELASTICJOB_HOSTNAME"
ENV_LOCAL_RANK = "ELASTICJOB_LOCAL_RANK"
ENV_BIND_ADDRESS = "ELASTICJOB_BIND_ADDRESS"
ENV_BACKEND = "ELASTICJOB_BACKEND"
ENV_RENDEZVOUS_CA = "ELASTICJOB_RENDEZVOUS_CA"
"""PEM text (not a path) of the CA certificate(s) a worker verifies an ``https://``
rendezvous URL against; unset: the system's trusted CAs."""
# Optional tuning of the worker runtime (defaults in ``elasticjob.worker_runtime.config``).
ENV_COLLECTIVE_TIMEOUT = "ELASTICJOB_COLLECTIVE_TIMEOUT"
"""Bound on any collective, in seconds."""
ENV_ROUND_WAIT = "ELASTICJOB_ROUND_WAIT"
"""How long a worker waits for its next round, in seconds."""
ENV_HEARTBEAT_INTERVAL = "ELASTICJOB_HEARTBEAT_INTERVAL"
"""Seconds between a worker's heartbeats (0: none). The driver evicts a worker that sent
none for its heartbeat timeout, so the interval must be a fraction of that timeout."""
ENV_ORPHAN_TIMEOUT = "ELASTICJOB_ORPHAN_TIMEOUT"
"""Seconds a worker keeps running while its rendezvous service is unreachable, then exits
(its launcher is gone). The local launcher sets a short one; the runtime's default outlasts an
operator restart."""
ENV_DEFER_SIGTERM = "ELASTICJOB_DEFER_SIGTERM"
"""``1``: the first SIGTERM lets the worker leave at its next host-update check (pods)."""
ENV_PROBE_AFTER = "ELASTICJOB_PROBE_AFTER"
"""Seconds a collective (or the forming of a round's group) may block before the worker's
heartbeat thread probes its peers and reports those it cannot reach (0: never probe)."""
ENV_TIMELINE_DIR = "ELASTICJOB_TIMELINE_DIR"
"""Folder where each worker process appends its timeline events (``--timeline-filename``
of ``elasticjob-run``; unset: no timeline is recorded)."""
# The job's checkpoint policy (durable fallback when no worker of a round survives): rank 0
# writes the committed state under the folder, and a new rank 0 without a survivor loads the
# newest complete checkpoint found there (see ``elasticjob.worker_runtime.elastic.checkpoint``).
ENV_CHECKPOINT_DIR = "ELASTICJOB_CHECKPOINT_DIR"
"""Folder of the job's checkpoints (unset: no checkpoints, no fallback)."""
ENV_CHECKPOINT_EVERY_COMMITS = "ELASTICJOB_CHECKPOINT_EVERY_COMMITS"
"""Write a checkpoint every this many commits (0 or unset: not by count)."""
ENV_CHECKPOINT_INTERVAL = "ELASTICJOB_CHECKPOINT_INTERVAL"
"""Write a checkpoint at the first commit at least this many seconds after the previous one
(0 or unset: not by time)."""
ENV_CHECKPOINT_KEEP = "ELASTICJOB_CHECKPOINT_KEEP"
"""How many complete checkpoints to keep (the newest ones)."""

# Variables that training scripts and their libraries read (horovodrun's and torchrun's), set
# by ``elasticjob.script_env``: the launch-time ones by the launcher (or the operator and the
# slots runner), the others by the worker runtime whenever the worker joins a round.
ENV_HOROVOD_HOSTNAME = "HOROVOD_HOSTNAME"
ENV_HOROVOD_LOCAL_RANK = "HOROVOD_LOCAL_RANK"
ENV_HOROVOD_RANK = "HOROVOD_RANK"
ENV_HOROVOD_SIZE = "HOROVOD_SIZE"
ENV_HOROVOD_LOCAL_SIZE = "HOROVOD_LOCAL_SIZE"
ENV_HOROVOD_CROSS_RANK = "HOROVOD_CROSS_RANK"
ENV_HOROVOD_CROSS_SIZE = "HOROVOD_CROSS_SIZE"
ENV_TORCH_RANK = "RANK"
ENV_TORCH_WORLD_SIZE = "WORLD_SIZE"
ENV_TORCH_LOCAL_RANK = "LOCAL_RANK"
ENV_TORCH_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
ENV_TORCH_GROUP_RANK = "GROUP_RANK"
ENV_TORCH_MASTER_ADDR = "MASTER_ADDR"
ENV_TORCH_MASTER_PORT = "MASTER_PORT"
ENV_TORCH_RUN_ID = "TORCHELASTIC_RUN_ID"
SCRIPT_LAUNCH_ENV = frozenset({ENV_HOROVOD_HOSTNAME, ENV_HOROVOD_LOCAL_RANK, ENV_TORCH_LOCAL_RANK})
"""Script variables known when a worker process starts (its host and slot)."""
SCRIPT_ROUND_ENV = frozenset(
    {
        ENV_HOROVOD_RANK,
        ENV_HOROVOD_SIZE,
        ENV_HOROVOD_LOCAL_SIZE,
        ENV_HOROVOD_CROSS_RANK,
        ENV_HOROVOD_CROSS_SIZE,
        ENV_TORCH_RANK,
        ENV_TORCH_WORLD_SIZE,
        ENV_TORCH_LOCAL_WORLD_SIZE,
        ENV_TORCH_GROUP_RANK,
        ENV_TORCH_MASTER_ADDR,
        ENV_TORCH_MASTER_PORT,
        ENV_TORCH_RUN_ID,
    }
)
"""Script variables of the round the worker is in: rewritten in ``os.environ`` each round."""

WORKER_ENV_PREFIX = "ELASTICJOB_"
"""Prefix of every variable of the worker contract above."""
WORKER_CONTRACT_ENV = frozenset(
    {
        ENV_RENDEZVOUS_URL,
        ENV_JOB,
        ENV_TOKEN,
        ENV_HOSTNAME,
        ENV_LOCAL_RANK,
        ENV_BIND_ADDRESS,
        ENV_BACKEND,
        ENV_COLLECTIVE_TIMEOUT,
        ENV_ROUND_WAIT,
        ENV_HEARTBEAT_INTERVAL,
        ENV_ORPHAN_TIMEOUT,
        ENV_DEFER_SIGTERM,
        ENV_RENDEZVOUS_CA,
        ENV_PROBE_AFTER,
        ENV_TIMELINE_DIR,
        ENV_CHECKPOINT_DIR,
        ENV_CHECKPOINT_EVERY_COMMITS,
        ENV_CHECKPOINT_INTERVAL,
        ENV_CHECKPOINT_KEEP,
        *SCRIPT_LAUNCH_ENV,
    }
)
"""Every variable the operator may set for its workers: a pod template must not set them
(nor any other name with :data:`WORKER_ENV_PREFIX`). Add new contract variables here."""


def is_worker_contract_env(name: str) -> bool:
    """Whether ``name`` is a variable of the worker contract (the operator's to set)."""
    return name in WORKER_CONTRACT_ENV or name.startswith(WORKER_ENV_PREFIX)


# Variables of the libraries underneath that a launcher sets for its workers.
ENV_PYTHONUNBUFFERED = "PYTHONUNBUFFERED"
ENV_GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"
ENV_NCCL_SOCKET_IFNAME = "NCCL_SOCKET_IFNAME"
ENV_CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
"""Read, never set: the devices a worker process sees (see ``worker_runtime/devices.py``)."""

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


class _Strict(BaseModel):
    """Frozen, no unknown fields; every number and boolean field is strict (``Field(strict=
    True)``), so also Python callers cannot pass ``True`` or ``"1"`` for an integer."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class DuplicateKeyError(ValueError):
    """A JSON object names the same key twice."""


_Model = TypeVar("_Model", bound=BaseModel)


def _refuse_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    found: dict[str, object] = {}
    for key, value in pairs:
        if key in found:
            raise DuplicateKeyError(f"key {key!r} is given more than once")
        found[key] = value
    return found


def parse_json(model: type[_Model], data: bytes | str) -> _Model:
    """Validate JSON ``data`` as ``model`` (strictly, see the module docstring).

    Raises :class:`pydantic.ValidationError` for malformed JSON or a value the model refuses,
    and :class:`DuplicateKeyError` when an object of an otherwise valid body repeats a key."""
    parsed = model.model_validate_json(data, strict=True)
    # Only a body that validated is scanned again: its depth and size are bounded by the model.
    json.loads(data, object_pairs_hook=_refuse_duplicates)
    return parsed


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


class Notice(_Strict):
    """One entry of a job's notice log. ``seq`` is strictly increasing per job."""

    seq: Annotated[int, Field(strict=True, ge=1)]
    kind: NoticeKind
    round: RoundNumber
    """The round the notice is about (the round in force when it was posted)."""
    hosts: tuple[HostName, ...] = ()


class NoticesResponse(_Strict):
    notices: tuple[Notice, ...]
    latest_seq: Annotated[int, Field(strict=True, ge=0)]


class SlotInfo(_Strict):
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


class RendezvousRequest(_Strict):
    """A worker is READY for a round newer than ``after_round`` (0: it has never had one)."""

    hostname: HostName
    local_rank: LocalRank
    address: HostName
    """The address the worker binds to (its host's address or pod IP)."""
    store_port: Port
    """Port of the TCPStore server the worker hosts; used when it becomes rank 0."""
    probe_port: Port | None = None
    """Port of the listener its peers probe (protocol 6; None: an older worker, probed by
    nobody)."""
    after_round: RoundNumber = 0
    wait_seconds: Annotated[float, Field(strict=True, ge=0, le=60, allow_inf_nan=False)] = 30.0
    rolled_back: StrictBool = False
    """The worker left round ``after_round`` after a collective failed on it and rolled its
    state back to its last commit: the driver fails that round and re-syncs the next."""


class PeerEndpoint(_Strict):
    """A member of the round that a worker probes: who it is and the endpoint it registered
    with. A TCP connect to its probe listener is the probe."""

    hostname: HostName
    local_rank: LocalRank
    address: HostName
    store_port: Port
    """Its TCPStore server's port, which protocols 3 to 5 probed. Never probed now: a store
    server can stall for seconds on connections that close without a request."""
    probe_port: Port | None = None
    """Its probe listener's port (protocol 6; None: an older worker, which is not probed)."""


class RendezvousResponse(_Strict):
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
    (ASSIGNED only; never sent to a version-2 worker, see :data:`PROTOCOL_VERSION`)."""
    message: str = ""


class ResultRequest(_Strict):
    """A worker's final report for its process."""

    hostname: HostName
    local_rank: LocalRank
    state: WorkerState
    exit_code: Annotated[int, Field(strict=True, ge=-255, le=255)] | None = None
    message: Annotated[str, StringConstraints(max_length=4096)] = ""


class ProbedPeer(_Strict):
    """A peer a worker could not reach (see :class:`HeartbeatRequest`)."""

    hostname: HostName
    local_rank: LocalRank


class HeartbeatRequest(_Strict):
    """A worker process is alive. Sent by a background thread every heartbeat interval,
    whatever the training thread does, so only a frozen or cut-off process stops sending.

    While one of its collectives of ``round`` has blocked for the probe threshold (see
    :data:`ENV_PROBE_AFTER`), the worker probes the peers the round gave it
    (:attr:`RendezvousResponse.peers`) before each beat and sends the result: ``round`` and
    the peers it could not reach in ``unreachable`` (empty: it reached them all). Both are
    absent otherwise. The driver evicts a member a majority of its probers cannot reach
    (``elasticjob.driver.partition``)."""

    hostname: HostName
    local_rank: LocalRank
    round: RoundNumber | None = None
    """The round whose collective blocks (None: no probe report with this beat)."""
    unreachable: Annotated[tuple[ProbedPeer, ...], Field(max_length=MAX_PROBE_TARGETS)] = ()
    """The probed peers that did not answer; given only with ``round``."""

    @model_validator(mode="after")
    def _report_names_its_round(self) -> HeartbeatRequest:
        if self.round is None and self.unreachable:
            raise ValueError("unreachable peers are reported with the round they belong to")
        if len(set(self.unreachable)) != len(self.unreachable):
            raise ValueError("a peer is reported unreachable more than once")
        return self


MAX_REPORTED_COMMITS: Final = 64
"""Most commit durations one progress report carries (the newest ones)."""

_NonNegativeFloat = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False)]
_NonNegativeInt = Annotated[int, Field(strict=True, ge=0)]

MAX_REPORTED_CHECKPOINTS: Final = 16
"""Most checkpoint reports one progress report carries (the newest ones)."""


class CheckpointReport(_Strict):
    """A durable checkpoint of the committed state, written or loaded by rank 0 (protocol 5)."""

    name: Annotated[str, StringConstraints(min_length=1, max_length=253)]
    """The checkpoint's name in the job's checkpoint folder."""
    epoch: _NonNegativeInt
    step: _NonNegativeInt
    """The runtime's step count at the commit the checkpoint holds."""
    seconds: _NonNegativeFloat
    """How long writing (or loading) it took, copy to disk included."""
    size_bytes: _NonNegativeInt


class ProgressRequest(_Strict):
    """Training progress that rank 0 reports (shown in the job's status and the metrics)."""

    round: RoundNumber
    epoch: Annotated[int, Field(strict=True, ge=0)]
    step: Annotated[int, Field(strict=True, ge=0)]
    samples_per_second: _NonNegativeFloat = 0.0
    resumed: Annotated[bool, Field(strict=True)] = False
    """Training (re)starts in ``round`` now: its state is synced and the first step is next
    (the end of a recovery or of a resize; protocol 4)."""
    commit_seconds: Annotated[
        tuple[_NonNegativeFloat, ...], Field(max_length=MAX_REPORTED_COMMITS)
    ] = ()
    """How long each commit since the previous report took (protocol 4)."""
    checkpoints: Annotated[
        tuple[CheckpointReport, ...], Field(max_length=MAX_REPORTED_CHECKPOINTS)
    ] = ()
    """The checkpoints completed since the previous report (protocol 5)."""
    restored_from: CheckpointReport | None = None
    """The checkpoint this round's rank 0 loaded because no worker of the previous round
    survived (sent with ``resumed``; protocol 5)."""
    committed_step: _NonNegativeInt | None = None
    """The runtime's step count at rank 0's newest commit (``step`` is the script's own
    number when it reports progress): a durable fallback loses the steps between this and the
    checkpoint it loads (protocol 5)."""


class RoundInfo(_Strict):
    """A job's current round, as ``GET /v1/jobs/{job}/round`` returns it."""

    job: str
    round: RoundNumber
    size: Annotated[int, Field(strict=True, ge=0)]
    hosts: tuple[HostName, ...]
    latest_notice_seq: Annotated[int, Field(strict=True, ge=0)]
    progress: ProgressRequest | None = None


class PlannedRound(_Strict):
    """The round the driver plans next while the workers it adds start
    (``GET /v1/jobs/{job}/plan``): a worker added to a running job takes its tentative place
    from it at ``init()``. Round 0 without slots: nothing is planned. (A service without this
    endpoint answers 404; the worker then estimates its place.)"""

    round: RoundNumber = 0
    slots: tuple[SlotInfo, ...] = ()


class ErrorResponse(_Strict):
    error: str
    detail: list[dict[str, object]] | str | None = None
