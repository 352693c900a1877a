"""The decisions of the elastic driver on events: pure functions of (state, event, now)
returning action values, one per question the driver has: what a worker's request for the next
round means (:func:`classify_ready`; its exit: ``worker_exits.py``), who leaves when hosts
vanish (:func:`leaving_members`), what follows a round (:func:`decide_round`), whether a failed
host discovery ends the job (:func:`decide_discovery_failure`). How the next round is planned
is in ``planning.py``; whom to stop for taking too long in ``timeouts.py``. ``driver.py`` and
``round_formation.py`` carry the actions out.
*Leaving*, *dismissed* and *failed* mean what
:class:`~elasticjob.driver.driver_types.Departure` says.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from elasticjob.driver.driver_types import DriverPhase
from elasticjob.driver.planning import ENABLE_CHECKPOINTS, EndJob
from elasticjob.driver.registry import RoundRecords
from elasticjob.driver.worker_record import WorkerRecord
from elasticjob.wire.messages import WorkerId, WorkerState

_NAMES_SHOWN = 8


def _names(items: Iterable[object]) -> str:
    """A sorted, comma-separated list of ``items``, shortened when long."""
    names = sorted(str(item) for item in items)
    shown = ", ".join(names[:_NAMES_SHOWN])
    if len(names) > _NAMES_SHOWN:
        shown += f" and {len(names) - _NAMES_SHOWN} more"
    return shown


# ---- worker events -----------------------------------------------------------------------


class ReadyVerdict(enum.Enum):
    """What a worker's request for the next round means (see :func:`classify_ready`)."""

    UNKNOWN = "unknown"  # not a worker this driver launched: ignore it
    WAITING = "waiting"  # not a member of the round in force asking for the next: note it
    READY = "ready"  # a member of the round in force reached the barrier: record READY
    ROLLED_BACK = "rolled-back"
    """A member reached the barrier after rolling back on a collective failure: record
    READY, fail the round (the other members abort their group) and sync the next round."""
    SCRIPT_FAILED = "script-failed"
    """A member reached the barrier after its script failed on its own (restart mode):
    record READY and how the script failed, and fail the round."""


def classify_ready(
    phase: DriverPhase,
    *,
    known: bool,
    member: bool,
    after_round: int,
    current_round: int,
    rolled_back: bool,
    script_failed: bool = False,
) -> ReadyVerdict:
    """What it means that a worker asks for a round newer than ``after_round``;
    ``rolled_back``: it rolled back after a collective failed; ``script_failed``: its script
    failed on its own (which an older agent said with ``rolled_back`` too)."""
    if not known:
        return ReadyVerdict.UNKNOWN
    if not member or after_round < current_round:
        return ReadyVerdict.WAITING
    if phase is DriverPhase.FINISHED:
        return ReadyVerdict.READY
    if script_failed:
        return ReadyVerdict.SCRIPT_FAILED
    return ReadyVerdict.ROLLED_BACK if rolled_back else ReadyVerdict.READY


def leaving_members(
    phase: DriverPhase,
    removed_hosts: Collection[str],
    members: Iterable[WorkerId],
    workers: Mapping[WorkerId, WorkerRecord],
) -> frozenset[WorkerId]:
    """The members of the running round that leave because discovery lost their hosts.
    Members whose process has ended already reported how, and do not leave; nor do those
    that reported how their process ends (their script ended: their host may vanish because
    the driver itself stops a teardown that hangs, and their exit counts as they reported)."""
    if phase is not DriverPhase.RUNNING:
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


def decide_discovery_failure(error: str, *, discovered_before: bool) -> EndJob | None:
    """A host discovery failed: the job ends at once if discovery has never worked (a
    missing or broken script), else None: the next discovery retries."""
    return None if discovered_before else EndJob(f"host discovery failed: {error}")


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
    reason: str = ""
    after_failure: bool = False
    """RESUME: the reset follows a failure (a member failed, rolled back or its script
    failed), so it counts against the restart limit too."""


def decide_round(
    records: RoundRecords,
    *,
    resets: int,
    reset_limit: int | None,
    checkpoint_fallback: bool = False,
    restarts: int = 0,
    restart_limit: int | None = None,
    failed_rounds_without_commit: int = 0,
    max_failed_rounds_without_commit: int | None = None,
) -> Decision:
    """Decide what the driver does once the counted members (members not leaving) reported.

    - a counted member has not reported: WAIT;
    - a counted member succeeded: SUCCEED;
    - every counted member's script failed on its own (``records.script_exits`` with an exit
      code, not a signal: an elastic script that raised, a restart-mode script that exited
      non-zero): FAIL with their exit codes and the log of the first; a restart would fail
      again;
    - every counted member failed (at least one) and some were lost rather than failing on
      their own (a killed process, a deleted pod or a lost node): FAIL, unless
      ``checkpoint_fallback`` is on: then the round resets as below, and the next one starts
      from the newest checkpoint;
    - no member is counted (all left gracefully): RESUME, the driver checks capacity;
    - otherwise the round resets: FAIL when ``resets + 1`` exceeds ``reset_limit``, or when
      the reset follows a failure and ``restarts + 1`` exceeds ``restart_limit`` (torchrun's
      ``--max-restarts``; ``None`` is unlimited), or when the reset follows a failure and
      this round makes ``failed_rounds_without_commit + 1`` rounds in a row that failed with
      no new commit between them, ``max_failed_rounds_without_commit`` or more (a broken
      script: it fails in every round, on one rank or some, before it commits anything),
      else RESUME (the hosts of the failed members were blacklisted as each failed:
      ``worker_exits.decide_exit``).
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
    every_failed = bool(counted) and len(failed) == len(counted)
    scripts_failed = [w for w in counted if w in records.script_exits]
    on_their_own = {w for w in scripts_failed if records.script_exits[w].exit_code > 0}
    if counted and on_their_own == counted:
        reason = f"the script failed on every worker: {_exits(records, counted)}"
        ended = f"all {len(failed)} workers failed; " if every_failed else ""
        return Decision(Action.FAIL, reason=ended + reason)
    if every_failed and not checkpoint_fallback:
        reason = f"all {len(failed)} workers failed: {_names(failed)}"
        return Decision(Action.FAIL, reason=f"{reason}; {ENABLE_CHECKPOINTS}")
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
    elif scripts_failed:
        what = f"the script failed on {_exits(records, counted)}"
    elif rolled_back:
        what = f"a collective failed on {_names(rolled_back)}, which rolled back"
    else:
        what = "no worker failed; the round is re-formed"
    after_failure = bool(failed or rolled_back or scripts_failed)
    if reset_limit is not None and resets + 1 > reset_limit:
        return Decision(Action.FAIL, reason=f"reset limit {reset_limit} exceeded: {what}")
    if after_failure and restart_limit is not None and restarts + 1 > restart_limit:
        return Decision(Action.FAIL, reason=f"restart limit {restart_limit} exceeded: {what}")
    stalled = failed_rounds_without_commit + 1
    if (
        after_failure
        and max_failed_rounds_without_commit is not None
        and stalled >= max_failed_rounds_without_commit
    ):
        reason = f"{stalled} rounds in a row failed with no new commit: {what}"
        if scripts_failed and failed:  # what names the failed workers, not their scripts
            reason += f"; the script failed on {_exits(records, counted)}"
        return Decision(Action.FAIL, reason=reason)
    reason = f"reset {resets + 1}: {what}"
    if failed_hosts:
        reason += f"; blacklisting hosts {_names(failed_hosts)}"
    if every_failed:
        reason += "; the next round starts from the newest checkpoint"
    return Decision(Action.RESUME, reason=reason, after_failure=after_failure)


def _exits(records: RoundRecords, counted: Collection[WorkerId]) -> str:
    """The script exits of ``counted`` members, the first one's log after them."""
    exits = [(w, e) for w, e in records.script_exits.items() if w in counted]
    described = ", ".join(f"{w} {e.status()}" for w, e in exits)
    first, script_exit = exits[0]
    if not script_exit.log_tail.strip():
        return described
    return f"{described}\nlast lines of {first}'s log:\n{script_exit.log_tail.rstrip()}"
