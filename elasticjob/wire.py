"""Wire types shared by the driver, the rendezvous service and the worker runtime.

This module is the only code the two sides of elasticjob have in common, so it imports
neither torch nor kopf nor aiohttp: pydantic models and enums only.

Every request body the rendezvous service accepts is one of the ``*Request`` models below;
they forbid unknown fields and bound every number, so malformed input is refused with a
4xx before it can touch any job's state.
"""

from __future__ import annotations

import enum
from typing import Annotated, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

API_PREFIX = "/v1"
"""Path prefix of every job-scoped endpoint of the rendezvous service."""

# Environment variables through which a launcher (or the operator) hands a worker its identity.
ENV_RENDEZVOUS_URL = "ELASTICJOB_RENDEZVOUS_URL"
ENV_RENDEZVOUS_CA = "ELASTICJOB_RENDEZVOUS_CA"
"""The CA certificate (PEM text) that verifies an ``https`` rendezvous URL's server."""
ENV_JOB = "ELASTICJOB_JOB"
ENV_TOKEN = "ELASTICJOB_TOKEN"
ENV_HOSTNAME = "ELASTICJOB_HOSTNAME"
ENV_LOCAL_RANK = "ELASTICJOB_LOCAL_RANK"
ENV_BIND_ADDRESS = "ELASTICJOB_BIND_ADDRESS"
ENV_BACKEND = "ELASTICJOB_BACKEND"
# Optional tuning of the worker runtime (defaults in ``elasticjob.worker_runtime.config``).
ENV_COLLECTIVE_TIMEOUT = "ELASTICJOB_COLLECTIVE_TIMEOUT"
"""Bound on any collective, in seconds."""
ENV_ROUND_WAIT = "ELASTICJOB_ROUND_WAIT"
"""How long a worker waits for its next round, in seconds."""
ENV_HEARTBEAT_INTERVAL = "ELASTICJOB_HEARTBEAT_INTERVAL"
"""Seconds between a worker's heartbeats (0: none). The driver evicts a worker that sent
none for its heartbeat timeout, so the interval must be a fraction of that timeout."""
ENV_DEFER_SIGTERM = "ELASTICJOB_DEFER_SIGTERM"
"""``1``: the first SIGTERM lets the worker leave at its next host-update check (pods)."""
# Variables of the libraries underneath that a launcher sets for its workers.
ENV_PYTHONUNBUFFERED = "PYTHONUNBUFFERED"
ENV_GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"
ENV_NCCL_SOCKET_IFNAME = "NCCL_SOCKET_IFNAME"

HostName = Annotated[
    str, StringConstraints(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9]([A-Za-z0-9.\-_]*)$")
]
"""A host as discovery names it: a DNS name, a pod name or an IPv4 address."""

JobName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=253, pattern=r"^[a-z0-9]([a-z0-9.\-]*[a-z0-9])?$"),
]
"""A job's name: a Kubernetes object name (``namespace.name`` for the operator)."""

LocalRank = Annotated[int, Field(ge=0, le=1023)]
Port = Annotated[int, Field(ge=1, le=65535)]
RoundNumber = Annotated[int, Field(ge=0)]


class WorkerId(NamedTuple):
    """A worker process: the host it runs on and its slot (local rank) there."""

    hostname: str
    local_rank: int

    def __str__(self) -> str:
        return f"{self.hostname}[{self.local_rank}]"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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

    seq: Annotated[int, Field(ge=1)]
    kind: NoticeKind
    round: RoundNumber
    """The round the notice is about (the round in force when it was posted)."""
    hosts: tuple[HostName, ...] = ()


class NoticesResponse(_Strict):
    notices: tuple[Notice, ...]
    latest_seq: Annotated[int, Field(ge=0)]


class SlotInfo(_Strict):
    """A worker's place in one round (Horovod's SlotInfo)."""

    hostname: HostName
    rank: Annotated[int, Field(ge=0)]
    local_rank: LocalRank
    cross_rank: Annotated[int, Field(ge=0)]
    size: Annotated[int, Field(ge=1)]
    local_size: Annotated[int, Field(ge=1)]
    cross_size: Annotated[int, Field(ge=1)]


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
    after_round: RoundNumber = 0
    wait_seconds: Annotated[float, Field(ge=0, le=60, allow_inf_nan=False)] = 30.0
    rolled_back: bool = False
    """The worker left round ``after_round`` after a collective failed on it and rolled its
    state back to its last commit: the driver fails that round and re-syncs the next."""


class RendezvousResponse(_Strict):
    status: RendezvousStatus
    round: RoundNumber = 0
    slot: SlotInfo | None = None
    store_address: HostName | None = None
    store_port: Port | None = None
    notice_seq: Annotated[int, Field(ge=0)] = 0
    """The job's latest notice sequence number when the round was published: notices up to it
    are already accounted for by this round, so members start counting host updates from it."""
    sync: bool = True
    """Whether state must be broadcast from rank 0 after forming the group. False only when
    every member kept identical live state (a graceful removal); the driver decides it once
    for the whole round, so ranks can never disagree on it."""
    message: str = ""


class ResultRequest(_Strict):
    """A worker's final report for its process."""

    hostname: HostName
    local_rank: LocalRank
    state: WorkerState
    exit_code: Annotated[int, Field(ge=-255, le=255)] | None = None
    message: Annotated[str, StringConstraints(max_length=4096)] = ""


class HeartbeatRequest(_Strict):
    """A worker process is alive. Sent by a background thread every heartbeat interval,
    whatever the training thread does, so only a frozen or cut-off process stops sending."""

    hostname: HostName
    local_rank: LocalRank


class ProgressRequest(_Strict):
    """Training progress that rank 0 reports (shown in the job's status)."""

    round: RoundNumber
    epoch: Annotated[int, Field(ge=0)]
    step: Annotated[int, Field(ge=0)]
    samples_per_second: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0


class RoundInfo(_Strict):
    """A job's current round, as ``GET /v1/jobs/{job}/round`` returns it."""

    job: str
    round: RoundNumber
    size: Annotated[int, Field(ge=0)]
    hosts: tuple[HostName, ...]
    latest_notice_seq: Annotated[int, Field(ge=0)]
    progress: ProgressRequest | None = None


class ErrorResponse(_Strict):
    error: str
    detail: list[dict[str, object]] | str | None = None
