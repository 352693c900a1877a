"""Every decision of the elastic driver: pure functions of (state, event, now) returning
action values, one per question the driver has: what a worker's exit or its request for the
next round means (:func:`classify_exit`, :func:`classify_ready`), who leaves on a discovery
(:func:`leaving_members`), what the next round is (:func:`plan_round`, :func:`decide_capacity`)
and when to publish it (:func:`decide_formation`), when to start and announce newcomers
(:func:`decide_scale_out`), what follows a round (:func:`decide_round`), whether a failed host
discovery ends the job (:func:`decide_discovery_failure`); whom to stop for taking too long is
in ``timeouts.py``. ``driver.py`` carries the actions out.
*Leaving*, *dismissed* and *failed* mean what :class:`~elasticjob.driver.api.Departure` says.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from elasticjob.driver.api import Departure, DriverSettings, Phase
from elasticjob.driver.hosts import Capacity
from elasticjob.driver.registry import RoundRecords
from elasticjob.driver.slots import assign_slots, missing_survivor
from elasticjob.driver.workers import WorkerRecord
from elasticjob.wire.messages import SlotInfo, WorkerId, WorkerState

_NAMES_SHOWN = 8


def _names(items: Iterable[object]) -> str:
    """A sorted, comma-separated list of ``items``, shortened when long."""
    names = sorted(str(item) for item in items)
    shown = ", ".join(names[:_NAMES_SHOWN])
    if len(names) > _NAMES_SHOWN:
        shown += f" and {len(names) - _NAMES_SHOWN} more"
    return shown


# ---- worker events -----------------------------------------------------------------------


class ExitVerdict(enum.Enum):
    """What the end of a worker process means (see :func:`classify_exit`)."""

    DEPARTED = "departed"  # a leaving or dismissed worker ended: not a failure
    ALREADY_FAILED = "already-failed"  # a worker counted as failed already (stopped) ended
    IGNORED = "ignored"  # the job has finished
    SUCCEEDED = "succeeded"  # a member of the running round exited 0: record SUCCESS
    FAILED = "failed"  # a member of the running round failed: record FAILURE, fail the round
    FAILED_OUTSIDE_ROUND = "failed-outside-round"  # no running round's member: blacklist
    ENDED_OUTSIDE_ROUND = "ended-outside-round"  # exit 0, no running round's member: nothing
    ENDED_WITHOUT_JOINING = "ended-without-joining"
    """Exit 0 from a process that never asked for a round: its command does not use the worker
    runtime (``hostname``, a torchrun script); a fresh process would do the same: fail the job."""


def classify_exit(
    phase: Phase,
    *,
    member: bool,
    departure: Departure | None,
    exit_code: int,
    registered: bool = True,
    stopped_after_success: bool = False,
) -> ExitVerdict:
    """What it means that a worker's process ended with ``exit_code``; ``member``: it is a
    member of the round in force; ``departure``: how it was already on its way out;
    ``registered``: it ever asked for a round or was a member of one;
    ``stopped_after_success``: the driver stopped it because it did not end after reporting
    success (see ``timeouts.overdue_endings``): its training finished, so it ended as 0."""
    if departure is Departure.FAILED:
        return ExitVerdict.ALREADY_FAILED
    if departure is not None:
        return ExitVerdict.DEPARTED
    if phase is Phase.FINISHED:
        return ExitVerdict.IGNORED
    ended_well = exit_code == 0 or stopped_after_success
    if member and phase is Phase.RUNNING:
        return ExitVerdict.SUCCEEDED if ended_well else ExitVerdict.FAILED
    if not ended_well:
        return ExitVerdict.FAILED_OUTSIDE_ROUND
    return ExitVerdict.ENDED_OUTSIDE_ROUND if registered else ExitVerdict.ENDED_WITHOUT_JOINING


class ReadyVerdict(enum.Enum):
    """What a worker's request for the next round means (see :func:`classify_ready`)."""

    UNKNOWN = "unknown"  # not a worker this driver launched: ignore it
    WAITING = "waiting"  # not a member of the round in force asking for the next: note it
    READY = "ready"  # a member of the round in force reached the barrier: record READY
    ROLLED_BACK = "rolled-back"
    """A member reached the barrier after rolling back on a collective failure: record
    READY, fail the round (the other members abort their group) and sync the next round."""


def classify_ready(
    phase: Phase,
    *,
    known: bool,
    member: bool,
    after_round: int,
    current_round: int,
    rolled_back: bool,
) -> ReadyVerdict:
    """What it means that a worker asks for a round newer than ``after_round``."""
    if not known:
        return ReadyVerdict.UNKNOWN
    if not member or after_round < current_round:
        return ReadyVerdict.WAITING
    if rolled_back and phase is not Phase.FINISHED:
        return ReadyVerdict.ROLLED_BACK
    return ReadyVerdict.READY


def leaving_members(
    phase: Phase,
    removed_hosts: Collection[str],
    members: Iterable[WorkerId],
    workers: Mapping[WorkerId, WorkerRecord],
) -> frozenset[WorkerId]:
    """The members of the running round that leave because discovery lost their hosts.
    Members whose process has ended already reported how, and do not leave; nor do those
    that reported how their process ends (their script ended: their host may vanish because
    the driver itself stops a teardown that hangs, and their exit counts as they reported)."""
    if phase is not Phase.RUNNING:
        return frozenset()
    return frozenset(
        w
        for w in members
        if w.hostname in removed_hosts
        and w in workers
        and workers[w].running
        and workers[w].departure is None
        and not workers[w].ending
    )


# ---- planning and forming rounds ---------------------------------------------------------


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


RoundPlan = FormRound | AwaitCapacity | EndJob


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
) -> RoundPlan:
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
    problem = missing_survivor(survivors, list(slots))
    if problem is None:
        return FormRound(slots)
    if settings.checkpoint_fallback:
        return FormRound(slots, from_checkpoint=True)
    return EndJob(f"{problem}; {ENABLE_CHECKPOINTS}")


def decide_discovery_failure(error: str, *, discovered_before: bool) -> EndJob | None:
    """A host discovery failed: the job ends at once if discovery has never worked (a
    missing or broken script), else None: the next discovery retries."""
    return None if discovered_before else EndJob(f"host discovery failed: {error}")


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
    plan: RoundPlan,
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


# ---- after a round -----------------------------------------------------------------------


class Action(enum.Enum):
    """What the driver does once a round's members have reported (see :func:`decide_round`)."""

    WAIT = "wait"  # not every member has reported yet
    RESUME = "resume"  # form the next round (after blacklisting ``Decision.blacklist``)
    SUCCEED = "succeed"  # training finished: the job ends with success
    FAIL = "fail"  # the job ends with failure (``Decision.reason`` says why)


@dataclass(frozen=True)
class Decision:
    action: Action
    blacklist: frozenset[str] = frozenset()
    reason: str = ""


def decide_round(
    records: RoundRecords,
    *,
    resets: int,
    reset_limit: int | None,
    checkpoint_fallback: bool = False,
    raised: Collection[WorkerId] = (),
) -> Decision:
    """Decide what the driver does once the counted members (members not leaving) reported.

    - a counted member has not reported: WAIT;
    - a counted member succeeded: SUCCEED;
    - every counted member failed (at least one): FAIL, unless ``checkpoint_fallback`` is on
      and some of them were lost rather than failing on their own (``raised``: the members
      that reported their script's error before ending; a killed process, a deleted pod or
      a lost node reports nothing): then the round resets as below, and the next one starts
      from the newest checkpoint. A script that raises everywhere would only raise again;
    - no member is counted (all left gracefully): RESUME, the driver checks capacity;
    - otherwise the round resets: FAIL when ``resets + 1`` exceeds ``reset_limit`` (``None``
      is unlimited), else RESUME, blacklisting the hosts of the failed members.
    """
    counted = records.members - records.leaving
    missing = [w for w in counted if w not in records.states]
    if missing:
        return Decision(
            Action.WAIT,
            reason=f"waiting for {len(missing)} of {len(counted)} workers: {_names(missing)}",
        )
    succeeded = [w for w in counted if records.states[w] is WorkerState.SUCCESS]
    if succeeded:
        return Decision(
            Action.SUCCEED,
            reason=f"{len(succeeded)} of {len(counted)} workers succeeded: {_names(succeeded)}",
        )
    failed = [w for w in counted if records.states[w] is WorkerState.FAILURE]
    lost = [w for w in failed if w not in raised]
    every_failed = bool(counted) and len(failed) == len(counted)
    if every_failed and not (checkpoint_fallback and lost):
        reason = f"all {len(failed)} workers failed: {_names(failed)}"
        return Decision(Action.FAIL, reason=f"{reason}; {ENABLE_CHECKPOINTS}" if lost else reason)
    if not counted:
        return Decision(
            Action.RESUME,
            reason=f"all {len(records.members)} workers of the round left gracefully",
        )
    failed_hosts = frozenset(w.hostname for w in failed)
    rolled_back = counted & records.rolled_back
    if every_failed:
        what = f"all {len(failed)} workers were lost ({_names(failed)})"
    elif failed:
        what = f"{len(failed)} of {len(counted)} workers failed ({_names(failed)})"
    elif rolled_back:
        what = f"a collective failed on {_names(rolled_back)}, which rolled back"
    else:
        what = "no worker failed; the round is re-formed"
    if reset_limit is not None and resets + 1 > reset_limit:
        return Decision(Action.FAIL, reason=f"reset limit {reset_limit} exceeded: {what}")
    reason = f"reset {resets + 1}: {what}"
    if failed_hosts:
        reason += f"; blacklisting hosts {_names(failed_hosts)}"
    if every_failed:
        reason += "; the next round starts from the newest checkpoint"
    return Decision(Action.RESUME, blacklist=failed_hosts, reason=reason)
