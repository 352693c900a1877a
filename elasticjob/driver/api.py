"""Small abstract types of the elastic driver.

The driver is plain Python (no torch, no kopf). Its pieces:

- :class:`HostDiscovery` finds the hosts that may run workers (``discovery.py``: a
  horovodrun-style discovery script, a fixed list; the operator discovers pods);
- ``hosts.py`` keeps them in a stable, oldest-first order, leaving out the blacklisted ones
  (``blacklist.py``: exponential cooldown, for hosts, nodes or pods);
- ``slots.py`` turns ordered hosts into per-process :class:`~elasticjob.wire.SlotInfo`;
- ``registry.py`` records what each worker of a round reported and decides, as a pure function,
  what the driver does next;
- :class:`WorkerLauncher` starts and stops worker processes (local processes, or pods);
- ``driver.py`` ties them to the rendezvous service.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable
from dataclasses import dataclass

from elasticjob.wire import WorkerId

Clock = Callable[[], float]
"""Monotonic seconds; injected so tests control time."""


class DriverError(RuntimeError):
    """A condition that ends the job, with a message for the user."""


class DiscoveryError(DriverError):
    """Host discovery failed (script missing, non-zero exit, malformed line)."""


class HostDiscovery(abc.ABC):
    """Finds the hosts available to the job right now."""

    @abc.abstractmethod
    def find_available_hosts_and_slots(self) -> dict[str, int]:
        """Return ``{hostname: slots}`` for every host that may run workers now.

        Raises :class:`DiscoveryError` with a message naming the problem when discovery
        itself fails (as opposed to finding no hosts, which returns ``{}``).
        """


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
    async def start(self, worker: WorkerId) -> None:
        """Start the worker process for ``worker``; return once it is started (it registers
        with the rendezvous on its own). The launcher reports its exit through the callback
        it was given."""

    @abc.abstractmethod
    async def stop(self, worker: WorkerId) -> None:
        """Ask the worker process to stop (SIGTERM, then SIGKILL after a grace period)."""

    async def kill(self, worker: WorkerId) -> None:
        """Stop the worker process at once, without a grace period: it stopped answering, so
        it cannot exit on its own. A launcher that cannot do better stops it as :meth:`stop`
        does."""
        await self.stop(worker)

    @abc.abstractmethod
    async def stop_all(self) -> None:
        """Stop every process still running and wait for them."""


class Action(enum.Enum):
    """What the driver does once a round's workers have reported (see ``registry.decide``)."""

    WAIT = "wait"
    """Not every member has reported yet."""
    RESUME = "resume"
    """Form the next round (after blacklisting ``Decision.blacklist``)."""
    SUCCEED = "succeed"
    """Training finished: the job ends with success."""
    FAIL = "fail"
    """The job ends with failure (``Decision.reason`` says why)."""


@dataclass(frozen=True)
class Decision:
    action: Action
    blacklist: frozenset[str] = frozenset()
    reason: str = ""


class CapacityAction(enum.Enum):
    """Whether enough slots are available to form a round (see ``registry.decide_capacity``)."""

    PROCEED = "proceed"
    WAIT = "wait"
    TIMEOUT = "timeout"


__all__ = [
    "Action",
    "CapacityAction",
    "Clock",
    "Decision",
    "DiscoveryError",
    "DriverError",
    "HostDiscovery",
    "HostUpdate",
    "WorkerId",
    "WorkerLauncher",
]
