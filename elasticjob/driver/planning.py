"""How the driver plans its next round, as pure functions returning action values: whether
enough slots are there (:func:`decide_capacity`), which slots the round has
(:func:`plan_round`), when to publish it (:func:`decide_formation`), and when to start and
announce a running round's newcomers (:func:`decide_scale_out`). ``round_formation.py`` carries
them out.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Final

from elasticjob.driver.driver_types import Departure, DriverSettings
from elasticjob.driver.host_manager import Capacity
from elasticjob.driver.rank_placement import place_hosts
from elasticjob.driver.slot_assignment import assign_slots, missing_survivor, round_hosts
from elasticjob.driver.worker_record import WorkerRecord
from elasticjob.wire.messages import HeldShards, SlotInfo, WorkerId


class CapacityAction(enum.Enum):
    """Whether enough slots are there to form a round (see :func:`decide_capacity`)."""

    PROCEED = "proceed"
    WAIT = "wait"
    TIMEOUT = "timeout"


def decide_capacity(
    *,
    available_slots: int,
    min_np: int,
    waiting_since: float | None,
    now: float,
    elastic_timeout_s: float,
) -> CapacityAction:
    """PROCEED when at least ``min_np`` slots are available; otherwise WAIT until
    ``elastic_timeout_s`` has passed since ``waiting_since`` (``None``: waiting starts now),
    then TIMEOUT."""
    if available_slots >= min_np:
        return CapacityAction.PROCEED
    if waiting_since is None or now - waiting_since < elastic_timeout_s:
        return CapacityAction.WAIT
    return CapacityAction.TIMEOUT


@dataclass(frozen=True)
class FormRound:
    """Form the next round with these slots (rank order)."""

    slots: Mapping[WorkerId, SlotInfo]
    from_checkpoint: bool = False
    """No worker of the previous round survives to be its rank 0: the round's fresh rank 0
    loads the job's newest complete checkpoint (the durable fallback)."""


@dataclass(frozen=True)
class AwaitCapacity:
    """Too few slots: wait for more, counting the elastic timeout from ``since``."""

    since: float
    message: str


@dataclass(frozen=True)
class EndJob:
    """No round can be formed: the job fails with ``reason``."""

    reason: str


NextRound = FormRound | AwaitCapacity | EndJob


ENABLE_CHECKPOINTS: Final = (
    "durable checkpoints would let the job resume from the newest one instead "
    "(elasticjob-run --checkpoint-dir, or spec.checkpoint of an ElasticJob)"
)
"""How to turn the durable fallback on, said where its absence ends a job."""


def plan_round(
    capacity: Capacity,
    settings: DriverSettings,
    *,
    survivors: Collection[WorkerId] | None,
    waiting_since: float | None,
    now: float,
    held: Mapping[WorkerId, HeldShards] | None = None,
) -> NextRound:
    """The next round from the usable hosts. ``survivors``: the previous round's members
    whose processes live on with its state (None: no round to continue, a first round);
    the next round's rank 0 must be one of them, or, with the checkpoint fallback
    (``settings.checkpoint_fallback``), the round starts from the newest checkpoint.
    ``waiting_since``: when waiting for capacity started, if it has. With the fallback, a
    job whose every host is blacklisted waits for a cooldown to end (up to the elastic
    timeout) instead of failing: nothing is lost that the checkpoint does not hold."""
    available = sum(slots for _, slots in capacity.hosts)
    if available < settings.min_np:
        shortage = (
            f"{available} slots available on {len(capacity.hosts)} hosts, "
            f"but the job needs at least {settings.min_np} processes (min_np)"
        )
        error = capacity.discovery_error
        failing = f"; the last host discovery failed: {error}" if error else ""
        blacklisted = f"every discovered host is blacklisted: {sorted(capacity.blacklisted)}"
        if capacity.every_host_blacklisted:
            if not settings.checkpoint_fallback:
                return EndJob(blacklisted)
            failing += f"; {blacklisted}"
        action = decide_capacity(
            available_slots=available,
            min_np=settings.min_np,
            waiting_since=waiting_since,
            now=now,
            elastic_timeout_s=settings.elastic_timeout_s,
        )
        timeout = f"{settings.elastic_timeout_s:.0f} s"
        if action is CapacityAction.TIMEOUT:
            return EndJob(f"elastic timeout: {shortage} for {timeout}{failing}")
        since = now if waiting_since is None else waiting_since
        return AwaitCapacity(since, f"{shortage}; waiting up to {timeout}{failing}")
    slots = assign_slots(capacity.hosts, min_np=settings.min_np, max_np=settings.max_np)
    if held:
        placed = place_hosts(round_hosts(slots), held)
        slots = assign_slots(placed, min_np=settings.min_np, max_np=len(slots))
    problem = missing_survivor(survivors, list(slots))
    if problem is None:
        return FormRound(slots)
    if settings.checkpoint_fallback:
        return FormRound(slots, from_checkpoint=True)
    return EndJob(f"{problem}; {ENABLE_CHECKPOINTS}")


@dataclass(frozen=True)
class AwaitBarrier:
    """Some members of the planned round are not at the barrier yet."""

    missing: tuple[WorkerId, ...]


@dataclass(frozen=True)
class Publish:
    """Publish round ``round_number`` and dismiss ``outgoing``."""

    round_number: int
    slots: Mapping[WorkerId, SlotInfo]
    sync: bool
    """Whether every member must take rank 0's state: for a first round, after a failure or
    a rollback (``recovering``), and when newcomers join."""
    newcomers: tuple[WorkerId, ...]
    outgoing: tuple[WorkerId, ...]
    """Running workers without a place in the round (they leave, or were never needed)."""


def decide_formation(
    slots: Mapping[WorkerId, SlotInfo],
    workers: Mapping[WorkerId, WorkerRecord],
    *,
    current_round: int,
    recovering: bool,
) -> AwaitBarrier | Publish:
    """Publish the planned round once each of its members is at the barrier."""
    missing = tuple(w for w in slots if w not in workers or not workers[w].at_barrier)
    if missing:
        return AwaitBarrier(missing)
    newcomers = tuple(w for w in slots if workers[w].last_round == 0)
    outgoing = tuple(
        w
        for w, record in workers.items()
        if w not in slots and record.running and record.departure is not Departure.DISMISSED
    )
    return Publish(
        round_number=current_round + 1,
        slots=slots,
        sync=current_round == 0 or recovering or bool(newcomers),
        newcomers=newcomers,
        outgoing=outgoing,
    )


class ScaleOutAction(enum.Enum):
    NONE = "none"
    PREPARE = "prepare"  # start the newcomers without a process; wait until all registered
    ANNOUNCE = "announce"  # all registered: post HOSTS_ADDED, members re-form with them


@dataclass(frozen=True)
class ScaleOut:
    action: ScaleOutAction
    newcomers: tuple[WorkerId, ...] = ()


def decide_scale_out(
    plan: NextRound,
    members: Collection[WorkerId],
    workers: Mapping[WorkerId, WorkerRecord],
    *,
    leaving: bool,
    announced: bool,
    recovering: bool,
) -> ScaleOut:
    """While a round runs: whether to start workers for the planned newcomers, or to
    announce them. Nothing while members leave or newcomers were announced already; while
    the round is failing, newcomers are started but not announced (the next round takes
    them in)."""
    if leaving or announced or not isinstance(plan, FormRound):
        return ScaleOut(ScaleOutAction.NONE)
    newcomers = tuple(w for w in plan.slots if w not in members)
    if not newcomers:
        return ScaleOut(ScaleOutAction.NONE)
    if recovering or not all(w in workers and workers[w].at_barrier for w in newcomers):
        return ScaleOut(ScaleOutAction.PREPARE, newcomers)
    return ScaleOut(ScaleOutAction.ANNOUNCE, newcomers)
