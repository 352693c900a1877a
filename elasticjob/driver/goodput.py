"""Where a job's wall time went: productive training, or time lost, and to what.

Goodput is the share of a job's wall time spent in steps whose work is kept. The rest is
lost to one of the :class:`LostTo` causes:

- ``STARTUP``: from the job's start to its first step;
- ``RECOVERY``: from a failure (a worker died, or a collective failed) to the first step of
  the next round; the interval is the job's *time to recover*;
- ``ROLLBACK``: the training between the last commit before a failure and the failure, which
  the rollback throws away and the job trains again; after a durable fallback (no worker
  survived, rank 0 loaded a checkpoint), the training between that checkpoint and the loss
  too (:func:`on_restored`);
- ``RESIZE``: a graceful change of the world (hosts added or removed), from the round's end at
  the barrier to the first step of the next round.

:class:`LostTime` is a value; every transition (``on_*``) is a pure function of it, an event
and the event's time, so the accounting is table-tested without a clock. The driver feeds it
(see ``driver.py``); the operator turns it into metrics and status.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType


class LostTo(enum.StrEnum):
    """What a stretch of unproductive wall time was spent on."""

    STARTUP = "startup"
    RECOVERY = "recovery"
    ROLLBACK = "rollback"
    RESIZE = "resize"


def _no_loss() -> Mapping[LostTo, float]:
    return MappingProxyType(dict.fromkeys(LostTo, 0.0))


@dataclass(frozen=True)
class LostTime:
    """The accounting of one job so far (all times in the driver's clock, seconds)."""

    started_at: float
    paused_since: float | None
    """Start of the unproductive stretch under way (None: the job is training)."""
    paused_for: LostTo | None
    lost: Mapping[LostTo, float] = field(default_factory=_no_loss)
    """Seconds lost per cause in stretches that have ended."""
    last_commit_at: float | None = None
    """When the state was last committed in the stretch of training under way."""
    last_recovery_s: float | None = None
    """Length of the latest recovery (failure -> first step), once one has ended."""
    rollback_from: float | None = None
    """While recovering: where the training the failure threw away began (the last commit
    before it); what was trained before is kept, unless a checkpoint older than that is
    restored (see :func:`on_restored`)."""

    @classmethod
    def start(cls, now: float) -> LostTime:
        """A job that starts now (it is in its startup until its first step)."""
        return cls(started_at=now, paused_since=now, paused_for=LostTo.STARTUP)

    @classmethod
    def training(cls, now: float) -> LostTime:
        """A job found training now, whose past is unknown (a driver that restarted)."""
        return cls(started_at=now, paused_since=None, paused_for=None, last_commit_at=now)

    def resumed(self, lost: Mapping[LostTo, float], running_for_s: float) -> LostTime:
        """This accounting, for a job that had already run ``running_for_s`` and lost
        ``lost`` before it began (the job's status keeps both across driver restarts)."""
        carried = {cause: self.lost[cause] + max(lost.get(cause, 0.0), 0.0) for cause in LostTo}
        return replace(
            self,
            started_at=self.started_at - max(running_for_s, 0.0),
            lost=MappingProxyType(carried),
        )

    def lost_seconds(self, now: float) -> Mapping[LostTo, float]:
        """Seconds lost per cause up to ``now``, the stretch under way included."""
        lost = dict(self.lost)
        if self.paused_since is not None and self.paused_for is not None:
            lost[self.paused_for] += max(now - self.paused_since, 0.0)
        return MappingProxyType(lost)

    def goodput(self, now: float) -> float:
        """Share of the wall time since the start spent in productive steps (1.0 at start)."""
        wall = now - self.started_at
        if wall <= 0:
            return 1.0
        lost = sum(self.lost_seconds(now).values())
        return min(max(1.0 - lost / wall, 0.0), 1.0)


def on_failure(state: LostTime, now: float) -> LostTime:
    """A round failed: the work since the last commit is lost, recovery starts now.

    A failure while the job is already paused turns the stretch under way into a recovery
    (it ends with the next first step, whatever it began as)."""
    lost = dict(state.lost)
    if state.paused_since is None:
        if state.last_commit_at is not None:
            lost[LostTo.ROLLBACK] += max(now - state.last_commit_at, 0.0)
        return replace(
            state,
            paused_since=now,
            paused_for=LostTo.RECOVERY,
            lost=MappingProxyType(lost),
            last_commit_at=None,
            rollback_from=now if state.last_commit_at is None else min(state.last_commit_at, now),
        )
    if state.paused_for is LostTo.RESIZE:
        return replace(state, paused_for=LostTo.RECOVERY, rollback_from=state.paused_since)
    return state


def on_restored(state: LostTime, checkpoint_at: float | None) -> LostTime:
    """While recovering, the new round's rank 0 loaded a durable checkpoint of the state
    committed at ``checkpoint_at`` (None: unknown, e.g. written before a driver restart):
    the training between it and the loss, counted productive so far, is trained again, so
    it moves to ``ROLLBACK``. Call it before the round's :func:`on_first_step`."""
    if state.paused_for is not LostTo.RECOVERY or checkpoint_at is None:
        return state
    kept_until = state.rollback_from if state.rollback_from is not None else state.paused_since
    if kept_until is None or kept_until <= checkpoint_at:
        return state
    lost = dict(state.lost)
    lost[LostTo.ROLLBACK] += kept_until - checkpoint_at
    return replace(state, lost=MappingProxyType(lost), rollback_from=checkpoint_at)


def on_resize(state: LostTime, now: float) -> LostTime:
    """The round ended at the barrier for a graceful change of the world."""
    if state.paused_since is not None:
        return state
    return replace(state, paused_since=now, paused_for=LostTo.RESIZE)


def on_commit(state: LostTime, now: float) -> LostTime:
    """The state was committed (what was trained so far is safe from a rollback)."""
    if state.paused_since is not None:
        return state
    return replace(state, last_commit_at=now)


def on_first_step(state: LostTime, now: float) -> tuple[LostTime, float | None]:
    """Training resumed in a new round (or started). Returns the new state and, when the
    stretch that ended was a recovery, its length (the time to recover)."""
    if state.paused_since is None or state.paused_for is None:
        return state, None
    seconds = max(now - state.paused_since, 0.0)
    lost = dict(state.lost)
    lost[state.paused_for] += seconds
    recovery = seconds if state.paused_for is LostTo.RECOVERY else None
    return (
        replace(
            state,
            paused_since=None,
            paused_for=None,
            lost=MappingProxyType(lost),
            last_commit_at=now,
            last_recovery_s=recovery if recovery is not None else state.last_recovery_s,
            rollback_from=None,
        ),
        recovery,
    )
