"""Suspending a job: what the driver does, step by step, once asked to (a pure decision).

A suspension ends the job's run without losing work: the members of the round in force stop
at the same step (a ``SUSPEND`` notice, agreed like a host update), write their last commit as
a durable checkpoint where the job has a checkpoint policy, and ask for the next round saying
so; once every member has, or is gone, the run ends suspended and nothing is started until
the job is resumed (the operator's ``spec.suspend: false``: a new run, whose first round's
rank 0 loads that checkpoint). A round being formed, or recovered, is let form first, so that
its members' live state is saved too; so is the next round when members stopped without
saving (they stopped for an earlier notice, rolled back after a failure, or could not write).
Members that do not stop within the suspension's timeout (a script that never commits) are
stopped: the job resumes from the newest checkpoint it has, and says how many steps that
loses.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from elasticjob.driver.driver_types import DriverPhase


class SuspendMove(enum.Enum):
    """What the driver does next about a suspension it was asked for."""

    NOTIFY = "notify"
    """Post the ``SUSPEND`` notice: the round's members stop at their next check."""
    WAIT = "wait"
    """Wait: the members are on their way to the barrier, or a round is being formed."""
    REFORM = "reform"
    """Members stopped without saving their state: let the next round form (then tell it)."""
    END = "end"
    """End the run, suspended."""


@dataclass(frozen=True)
class SuspendDecision:
    """A :class:`SuspendMove` and, for END, how the suspension went (for the user)."""

    move: SuspendMove
    reason: str = ""
    clean: bool = True
    """END: every member of the round saved its last commit (or no round was in force)."""


@dataclass(frozen=True)
class SuspendProgress:
    """Where a suspension is: when it was asked for and whether the members were told."""

    requested_at: float
    notified_round: int | None = None
    """The round whose members were told (None: not yet)."""


def decide_suspension(
    progress: SuspendProgress,
    phase: DriverPhase,
    *,
    current_round: int,
    recovering: bool,
    members: int,
    stopped: int,
    saved: int,
    unsaved: int,
    now: float,
    timeout_s: float,
) -> SuspendDecision:
    """What to do about a suspension asked for at ``progress.requested_at``, the driver in
    ``phase`` with round ``current_round`` in force (0: none yet) of ``members`` members, of
    which ``stopped`` are at the barrier after it or gone; of those at the barrier, ``saved``
    saved their state for the suspension and ``unsaved`` did not. ``recovering``: a member of
    it failed, the survivors are rolling back. ``timeout_s``: how long the members (and a
    round being formed or recovered) may take."""
    overdue = now - progress.requested_at >= timeout_s
    if phase is DriverPhase.STARTING:
        return SuspendDecision(SuspendMove.END, "no round was training yet")
    if phase is DriverPhase.FORMING or (recovering and progress.notified_round is None):
        if overdue:
            return SuspendDecision(
                SuspendMove.END,
                f"the next round did not form within {timeout_s:.0f} s; the survivors' "
                "commits since the last checkpoint are lost",
                clean=False,
            )
        return SuspendDecision(SuspendMove.WAIT)
    if progress.notified_round != current_round:
        return SuspendDecision(SuspendMove.NOTIFY)
    if stopped < members:
        if overdue:
            return SuspendDecision(
                SuspendMove.END,
                f"{members - stopped} of {members} workers of round {current_round} did not "
                f"stop within {timeout_s:.0f} s; their steps since the last checkpoint are lost",
                clean=False,
            )
        return SuspendDecision(SuspendMove.WAIT)
    if unsaved and not overdue:
        return SuspendDecision(SuspendMove.REFORM)
    if unsaved:
        return SuspendDecision(
            SuspendMove.END,
            f"{unsaved} of {members} workers of round {current_round} stopped without saving "
            f"their state within {timeout_s:.0f} s; their steps since the last checkpoint "
            "may be lost",
            clean=False,
        )
    if saved == 0:
        return SuspendDecision(
            SuspendMove.END,
            f"no worker of round {current_round} is left to save its state; the steps since "
            "the last checkpoint are lost",
            clean=False,
        )
    workers = "worker" if members == 1 else "workers"
    return SuspendDecision(
        SuspendMove.END,
        f"the {members} {workers} of round {current_round} stopped for the suspension",
    )
