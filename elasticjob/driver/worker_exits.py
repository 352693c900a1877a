"""What the end of a worker process means, and what follows it: pure functions of (the
driver's state, the exit, its cause) returning values. Every front end reports each end once,
with its cause, to :meth:`~elasticjob.driver.driver.ElasticDriver.on_worker_exit`; the driver
carries out its part of :class:`ExitEffects` (the blacklisting, the round's failure notice)
and hands the effects back, and the front end carries out the rest (under the operator: the
``WorkerFailed`` event and the pod's deletion, which makes room for its replacement).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from dataclasses import dataclass

from elasticjob.driver.driver_types import Departure, DriverPhase
from elasticjob.driver.worker_record import WorkerRecord
from elasticjob.wire.messages import WorkerState


class ExitCause(enum.Enum):
    """How a front end learned that a worker process ended."""

    EXITED = "exited"
    """It ended on its own: its process exited (under the operator: its container terminated,
    its pod's phase is Failed, or its node is not ready)."""
    SLOT_ENDED = "slot-ended"
    """It ended on its own, and what runs its host's processes saw it and lives on: a pod's
    slot supervisor reported it, or ``elasticjob-run``'s launcher saw it exit. Its host's
    other processes may live on, and its slot may start again in place
    (``slot_loss.py``)."""
    KILLED = "killed"
    """The driver had it killed: it sent no heartbeat, or its peers could not reach it."""
    VANISHED = "vanished"
    """It disappeared before it ended (its pod deleted by someone else, or while the operator
    was away): nothing is left of it, and its node is not to blame."""
    OVERDUE = "overdue"
    """It was leaving (its pod chosen to drain) and did not leave within the removal deadline:
    a departure, not a failure."""
    UNHEALTHY = "unhealthy"
    """It failed its pod's health check before joining, or was not judged in time."""


class ExitVerdict(enum.Enum):
    """What the end of a worker process means to the round (see :func:`classify_exit`)."""

    DEPARTED = "departed"  # a leaving or dismissed worker ended: not a failure
    LEFT_MID_ROUND = "left-mid-round"
    """A leaving member ended (its grace ran out, it was killed) before the round released it:
    its host is not to blame, but the other members wait for it in their collectives, so
    the round fails."""
    ALREADY_FAILED = "already-failed"  # a worker counted as failed already (stopped) ended
    IGNORED = "ignored"  # the job has finished
    SUCCEEDED = "succeeded"  # a member of the running round exited 0: record SUCCESS
    FAILED = "failed"  # a member of the running round failed: record FAILURE, fail the round
    FAILED_OUTSIDE_ROUND = "failed-outside-round"  # no running round's member failed
    ENDED_OUTSIDE_ROUND = "ended-outside-round"  # exit 0, no running round's member: nothing
    ENDED_WITHOUT_JOINING = "ended-without-joining"
    """Exit 0 from a process that never asked for a round: its command does not use the worker
    runtime (``hostname``, a torchrun script); a fresh process would do the same: fail the job."""


def classify_exit(
    phase: DriverPhase,
    *,
    member: bool,
    departure: Departure | None,
    exit_code: int,
    registered: bool = True,
    stopped_after_success: bool = False,
    at_barrier: bool = False,
) -> ExitVerdict:
    """What it means that a worker's process ended with ``exit_code``; ``member``: it is a
    member of the round in force; ``departure``: how it was already on its way out;
    ``registered``: it ever asked for a round or was a member of one;
    ``stopped_after_success``: the driver stopped it because it did not end after reporting
    success (see ``timeouts.overdue_endings``): its training finished, so it ended as 0;
    ``at_barrier``: it had stopped with the round's other members at their agreed check and
    asked for the next round (they no longer wait for it in a collective)."""
    if departure is Departure.FAILED:
        return ExitVerdict.ALREADY_FAILED
    in_running_round = member and phase is DriverPhase.RUNNING
    if departure is Departure.LEAVING and in_running_round and not at_barrier and exit_code:
        return ExitVerdict.LEFT_MID_ROUND
    if departure is not None:
        return ExitVerdict.DEPARTED
    if phase is DriverPhase.FINISHED:
        return ExitVerdict.IGNORED
    ended_well = exit_code == 0 or stopped_after_success
    if in_running_round:
        return ExitVerdict.SUCCEEDED if ended_well else ExitVerdict.FAILED
    if not ended_well:
        return ExitVerdict.FAILED_OUTSIDE_ROUND
    return ExitVerdict.ENDED_OUTSIDE_ROUND if registered else ExitVerdict.ENDED_WITHOUT_JOINING


def classify_end(
    phase: DriverPhase,
    record: WorkerRecord,
    exit_code: int,
    *,
    member: bool,
    reported: WorkerState | None,
) -> ExitVerdict:
    """:func:`classify_exit` for the process ``record`` describes, asked while it still
    counts as running; ``reported``: the state it reported with its result, if any."""
    return classify_exit(
        phase,
        member=member,
        departure=record.departure,
        exit_code=exit_code,
        registered=record.registered,
        stopped_after_success=record.stop_requested and reported is WorkerState.SUCCESS,
        at_barrier=record.at_barrier,
    )


@dataclass(frozen=True)
class ExitEffects:
    """What follows the end of a worker process, besides what its verdict records."""

    blacklist: bool = False
    """Its host is struck (the driver, through its front end's blacklist: the pod's node, or
    the pod, under the operator)."""
    fail_round: bool = False
    """The round in force fails now: ``ROUND_FAILED`` tells its members to abort their group
    (the driver)."""
    announce: bool = False
    """The front end tells its users that the worker failed (under the operator: a
    ``WorkerFailed`` event on the job)."""
    replace: bool = False
    """The front end removes what is left of it at once, so that a fresh one can take its
    place (under the operator: its pod is deleted without a grace period)."""
    restart: bool = False
    """Its host lives on and starts a fresh process in its slot (``slot_loss.py``): the host
    is not struck, and its other processes stay."""

    @classmethod
    def of_all(cls, effects: Iterable[ExitEffects]) -> ExitEffects:
        """The effects of several ends together (the workers of one pod): each that any
        has."""
        found = list(effects)
        return cls(
            **{f.name: any(getattr(e, f.name) for e in found) for f in dataclasses.fields(cls)}
        )


NO_EFFECTS: ExitEffects = ExitEffects()
"""An end that changes nothing (one heard already)."""

_STRUCK = frozenset({ExitVerdict.FAILED, ExitVerdict.FAILED_OUTSIDE_ROUND})
"""Verdicts of a failure that is the host's to answer for."""
_BREAK_THE_ROUND = frozenset({ExitVerdict.FAILED, ExitVerdict.LEFT_MID_ROUND})
"""Verdicts of an end that the running round's members cannot go on without."""


def decide_exit(
    verdict: ExitVerdict | None,
    cause: ExitCause,
    exit_code: int,
    *,
    recovering: bool,
    restart_slot: bool = False,
) -> ExitEffects:
    """What follows a worker's end (``verdict`` None: the driver never launched it, e.g. a
    pod that failed before it ran, or one whose health check failed; ``recovering``: the
    round in force failed already):

    - a failure of its own (``EXITED`` or ``KILLED``, non-zero): announced, and what is left of
      it removed; its host is struck when the failure is the worker's (a member's, a
      newcomer's, or one the driver never launched), not when it was leaving, dismissed,
      already counted as failed (and struck then), or the job had ended;
    - a member's failure fails the round once: the first failure of a round posts the notice;
      so does the end of a leaving member that the round had not released yet;
    - a member's failure whose slot restarts in place (``restart_slot``, the plan of
      ``slot_loss.py`` for a host that lives on): announced and the round failed, nothing
      struck or removed;
    - a failed health check: struck and removed, not announced (its own event says why);
    - a worker that did not leave in time: removed, nothing else (it was leaving);
    - one that vanished: nothing (nothing is left of it, and its host is not to blame);
    - an end with exit code 0, or one the driver stopped after the worker reported success:
      nothing here (its verdict says what it means).
    """
    fail_round = verdict in _BREAK_THE_ROUND and not recovering
    if cause is ExitCause.UNHEALTHY:
        return ExitEffects(blacklist=True, replace=True)
    if cause is ExitCause.OVERDUE:
        return ExitEffects(fail_round=fail_round, replace=True)
    if cause is ExitCause.VANISHED or exit_code == 0 or verdict is ExitVerdict.SUCCEEDED:
        return ExitEffects(fail_round=fail_round)
    if restart_slot and cause is ExitCause.SLOT_ENDED and verdict is ExitVerdict.FAILED:
        return ExitEffects(fail_round=fail_round, announce=True, restart=True)
    return ExitEffects(
        blacklist=verdict is None or verdict in _STRUCK,
        fail_round=fail_round,
        announce=True,
        replace=True,
    )
