"""Small abstract types of the elastic driver.

The driver is plain Python (no torch, no kopf). Its pieces:

- the front end tells the driver which hosts may run workers when they change
  (:meth:`~elasticjob.driver.driver.ElasticDriver.update_hosts`): the local launcher polls a
  horovodrun-style discovery script or a fixed list (``discovery.py``), the operator pushes
  its worker pods as they become usable;
- ``host_manager.py`` keeps them in a stable, oldest-first order, leaving out the blacklisted ones
  (``blacklist.py``: exponential cooldown; one owner per front end, the driver's own list of
  hosts or the operator's nodes and pods);
- ``slot_assignment.py`` turns ordered hosts into per-process
  :class:`~elasticjob.wire.messages.SlotInfo`;
- ``registry.py`` records what each member of a round reported;
- ``decisions.py`` and ``planning.py`` decide, as pure functions of state, event and time
  returning action values, everything the driver does: what a worker's exit means, what
  follows a round (``decisions.py``); how the next round is planned, when it is published,
  when newcomers are started and announced (``planning.py``);
- :class:`WorkerLauncher` starts and stops worker processes (local processes, or pods);
  ``workers.py`` keeps what the driver knows about each process it launched;
- ``driver.py`` carries the decisions out against the launcher and the rendezvous service,
  ``round_formation.py`` the planning of its rounds; ``job_snapshot.py`` is what it knows as one
  value, ``journal.py`` what happened to the job, pushed to its subscribers.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Protocol

from elasticjob.driver.liveness import heartbeat_interval_s
from elasticjob.driver.stragglers import StragglerPolicy
from elasticjob.wire.messages import SlotInfo, WorkerId

Clock = Callable[[], float]
"""Monotonic seconds; injected so tests control time."""


class DriverError(RuntimeError):
    """A condition that ends the job, with a message for the user."""


class DiscoveryError(DriverError):
    """Host discovery failed (script missing, non-zero exit, malformed line)."""


@dataclass(frozen=True)
class HostUpdate:
    """How the available hosts changed since the previous discovery."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed)


class WorkerLauncher(abc.ABC):
    """Starts and stops the processes of a job's workers (one per slot)."""

    @abc.abstractmethod
    async def start(self, worker: WorkerId, planned: SlotInfo) -> None:
        """Start the worker process for ``worker``, planned into ``planned`` in the round it
        starts for (what horovodrun tells a process when it starts); return once it is
        started (it registers with the rendezvous on its own). The launcher reports its exit
        through the callback it was given."""

    @abc.abstractmethod
    async def stop(self, worker: WorkerId) -> None:
        """Ask the worker process to stop (SIGTERM, then SIGKILL after a grace period)."""

    async def kill(self, worker: WorkerId, reason: str) -> None:
        """Stop the worker process at once, without a grace period: it stopped answering
        (``reason`` says how: no heartbeat, or its peers cannot reach it), so it cannot exit
        on its own. A launcher that cannot do better stops it as :meth:`stop` does."""
        await self.stop(worker)

    @abc.abstractmethod
    async def stop_all(self) -> None:
        """Stop every process still running and wait for them."""


class DriverPhase(enum.Enum):
    """The driver's lifecycle: STARTING (launch the first workers, wait until they register)
    -> RUNNING (a round is in force) -> FORMING (the round ended at the barrier; the next one
    is being formed) -> RUNNING ... -> FINISHED."""

    STARTING = "starting"
    RUNNING = "running"
    FORMING = "forming"
    FINISHED = "finished"


class Departure(enum.Enum):
    """How a worker stops being part of the job: the one vocabulary of the driver, the
    registry and the rendezvous.

    A worker that *leaves*, one that is *dismissed* and one that *failed* are three different
    things: only a failure gets a host blacklisted; a failure, or a leaver that ends before
    it was released, breaks a round and costs a reset.
    """

    LEAVING = "leaving"
    """Its host is going away (scale-in, preemption): announced with a ``HOSTS_REMOVED``
    notice, it reaches the barrier with the other members, keeps its live state, and is then
    dismissed. Never its host's failure (see ``decisions.leaving_members``); but if it ends
    before the round released it, the round's other members lose it in their collectives and
    the round fails (``worker_exits.ExitVerdict.LEFT_MID_ROUND``)."""
    DISMISSED = "dismissed"
    """Told to exit: the rendezvous answers its requests ``REMOVED`` and it exits 0
    (``JobRendezvous.dismiss``): a leaving worker once the next round is published, or a
    worker without a place in it."""
    FAILED = "failed"
    """Its process ended with a non-zero status, or it did not register in time: a member's
    failure fails the round (``ROUND_FAILED``); the host is blacklisted."""


class JobMode(enum.StrEnum):
    """How a job's script survives a change of its members."""

    ELASTIC = "elastic"
    """It uses the elastic API: its processes and their state live on."""
    RESTART = "restart"
    """A torchrun script: stopped and started again with its new rank, in the same process
    slot (``elasticjob.worker_runtime.agents.restart_agent``)."""


DEFAULT_MAX_RESTARTS: Final = 3
"""A restart-mode job's restart limit when it sets none."""
DEFAULT_START_TIMEOUT_S: Final = 120.0
"""How long a newly launched worker may take to register, unless the job says otherwise."""
DEFAULT_MAX_FAILED_ROUNDS_WITHOUT_COMMIT: Final = 3
"""An elastic job fails once this many rounds in a row failed with no new commit between
them, unless it sets another limit (0: none)."""


@dataclass(frozen=True)
class Recovery:
    """How a job recovers from failures, as its mode and settings make it (one derivation
    for the launcher and the operator)."""

    restart_limit: int | None
    """``DriverSettings.restart_limit``: the job's ``max_restarts``, else
    :data:`DEFAULT_MAX_RESTARTS` in restart mode and unlimited (None) in elastic mode."""
    checkpoint_fallback: bool
    """``DriverSettings.checkpoint_fallback``: a checkpoint policy is configured, or the job
    runs in restart mode (its script resumes from a checkpoint of its own)."""
    script_max_restarts: int | None
    """What the restart agent tells the script (``TORCHELASTIC_MAX_RESTARTS``); None in
    elastic mode, which has no agent."""
    max_failed_rounds_without_commit: int | None
    """``DriverSettings.max_failed_rounds_without_commit``: in elastic mode, the job's limit
    (0: none), else :data:`DEFAULT_MAX_FAILED_ROUNDS_WITHOUT_COMMIT`; None in restart mode,
    whose scripts commit nothing the driver hears of (its restart limit ends a broken one)."""


def recovery(
    mode: JobMode,
    *,
    max_restarts: int | None,
    checkpoints: bool,
    max_failed_rounds_without_commit: int | None = None,
) -> Recovery:
    """The recovery of a job in ``mode`` that set ``max_restarts`` and
    ``max_failed_rounds_without_commit`` (None: not set) and has a checkpoint policy or not
    (``checkpoints``)."""
    restart = mode is JobMode.RESTART
    if max_restarts is None and restart:
        max_restarts = DEFAULT_MAX_RESTARTS
    if max_failed_rounds_without_commit is None:
        max_failed_rounds_without_commit = DEFAULT_MAX_FAILED_ROUNDS_WITHOUT_COMMIT
    return Recovery(
        restart_limit=max_restarts,
        checkpoint_fallback=checkpoints or restart,
        script_max_restarts=max_restarts if restart else None,
        max_failed_rounds_without_commit=None
        if restart
        else (max_failed_rounds_without_commit or None),
    )


@dataclass(frozen=True)
class DriverSettings:
    """The elastic settings of one job (horovodrun's flags, or the ElasticJob spec)."""

    min_np: int = 1
    max_np: int | None = None
    reset_limit: int | None = None
    """Fail the job once it would reset more than this many times (horovodrun's
    ``--reset-limit``: every reset counts, those that only add or remove hosts too)."""
    restart_limit: int | None = None
    """Fail the job once it would reset after a failure more than this many times (torchrun's
    ``--max-restarts``: resets that only add or remove hosts do not count)."""
    max_failed_rounds_without_commit: int | None = None
    """Fail the job once this many rounds in a row failed with no new commit between them (a
    broken script; None: never)."""
    elastic_timeout_s: float = 600.0
    """How long to wait while fewer than ``min_np`` slots are available."""
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S
    """How long a newly launched worker may take to register before it counts as failed."""
    active_deadline_s: float | None = None
    """Fail the job once it has run this long, its time suspended left out (None: never)."""
    removal_grace_s: float = 30.0
    """How long a worker on its way out may take to exit before it is stopped: a dismissed
    one, or one that reported how its process ends (its result) and hangs in its teardown."""
    heartbeat_timeout_s: float | None = None
    """Evict a worker process that sent no heartbeat for this long (None: never; see
    ``liveness.py``)."""
    stragglers: StragglerPolicy = field(default_factory=StragglerPolicy)
    """When a member counts as a straggler, and whether it is replaced."""
    suspend_timeout_s: float = 300.0
    """How long a suspension waits for the members of the round to save their state and stop
    (and for a round being formed to form first); those still running then are stopped."""
    checkpoint_fallback: bool = False
    """The workers write durable checkpoints (a checkpoint policy is configured, or restart
    mode, whose script resumes from a checkpoint of its own): when no worker of the previous
    round survives, fresh workers start a new round whose rank 0 loads the newest complete
    checkpoint (False: the job fails, nobody holds its state)."""

    def __post_init__(self) -> None:
        if self.min_np < 1:
            raise ValueError(f"min_np must be >= 1, got {self.min_np}")
        if self.max_np is not None and self.max_np < self.min_np:
            raise ValueError(f"max_np ({self.max_np}) must be >= min_np ({self.min_np})")

    @property
    def heartbeat_interval_s(self) -> float | None:
        """How often the workers beat for ``heartbeat_timeout_s`` (None: they need not;
        ``liveness.heartbeat_interval_s``)."""
        return heartbeat_interval_s(self.heartbeat_timeout_s)


class DriverObserver(Protocol):
    """Told the durations the driver measures (the operator turns them into histograms)."""

    def round_formed(self, seconds: float) -> None:
        """A round was published ``seconds`` after the previous one ended or failed (after
        the job's start, for the first)."""

    def recovered(self, seconds: float) -> None:
        """Training resumed ``seconds`` after a failure (the time to recover)."""

    def committed(self, seconds: float) -> None:
        """Rank 0 committed its state in ``seconds``."""

    def checkpointed(self, seconds: float) -> None:
        """Rank 0 wrote a durable checkpoint in ``seconds``."""

    def health_checked(self, seconds: float, *, passed: bool) -> None:
        """A new pod's health check took ``seconds`` and ``passed`` or not."""


class Unobserved:
    """A :class:`DriverObserver` that ignores everything (the local launcher's)."""

    def round_formed(self, seconds: float) -> None:
        del seconds

    def recovered(self, seconds: float) -> None:
        del seconds

    def committed(self, seconds: float) -> None:
        del seconds

    def checkpointed(self, seconds: float) -> None:
        del seconds

    def health_checked(self, seconds: float, *, passed: bool) -> None:
        del seconds, passed


@dataclass(frozen=True)
class JobResult:
    """How a job's run ended: success or not and why, after how many rounds and resets; or
    ``suspended`` (not a success, not a failure: the job resumes when asked)."""

    success: bool
    message: str
    rounds: int
    resets: int
    suspended: bool = False
    deadline_exceeded: bool = False
    """It failed for its active deadline (``DriverSettings.active_deadline_s``)."""


__all__ = [
    "Clock",
    "Departure",
    "DiscoveryError",
    "DriverError",
    "DriverObserver",
    "DriverPhase",
    "DriverSettings",
    "HostUpdate",
    "JobResult",
    "Unobserved",
    "WorkerId",
    "WorkerLauncher",
]
