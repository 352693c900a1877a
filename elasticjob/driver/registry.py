"""What the workers of a round reported, and what the driver does about it.

:class:`WorkerRegistry` records the reports of the current round; :func:`decide` and
:func:`decide_capacity` are pure functions of what was recorded and of the time.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from elasticjob.driver.api import Action, CapacityAction, Decision
from elasticjob.wire import WorkerId, WorkerState

logger = logging.getLogger(__name__)

_NAMES_SHOWN = 8


def _names(items: Iterable[object]) -> str:
    """A sorted, comma-separated list of ``items``, shortened when long."""
    names = sorted(str(item) for item in items)
    shown = ", ".join(names[:_NAMES_SHOWN])
    if len(names) > _NAMES_SHOWN:
        shown += f" and {len(names) - _NAMES_SHOWN} more"
    return shown


@dataclass(frozen=True)
class RoundRecords:
    """What the members of one round have reported so far."""

    members: frozenset[WorkerId]
    states: Mapping[WorkerId, WorkerState] = field(default_factory=dict)
    """The latest state each worker reported (workers that reported nothing are absent)."""
    removed: frozenset[WorkerId] = frozenset()
    """Members leaving gracefully (scale-in, preemption): their states and absence are
    ignored, and their failure is never a failure of the job."""


def decide(records: RoundRecords, *, resets: int, reset_limit: int | None) -> Decision:
    """Decide what the driver does once the counted members (members not removed) reported.

    - a counted member has not reported: WAIT;
    - a counted member succeeded: SUCCEED;
    - every counted member failed (at least one): FAIL;
    - no member is counted (all left gracefully): RESUME, the driver checks capacity;
    - otherwise the round resets: FAIL when ``resets + 1`` exceeds ``reset_limit`` (``None``
      is unlimited), else RESUME, blacklisting the hosts of the failed members.
    """
    counted = records.members - records.removed
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
    if counted and len(failed) == len(counted):
        return Decision(Action.FAIL, reason=f"all {len(failed)} workers failed: {_names(failed)}")
    if not counted:
        return Decision(
            Action.RESUME,
            reason=f"all {len(records.members)} workers of the round left gracefully",
        )
    failed_hosts = frozenset(w.hostname for w in failed)
    what = (
        f"{len(failed)} of {len(counted)} workers failed ({_names(failed)})"
        if failed
        else "no worker failed; the round is re-formed"
    )
    if reset_limit is not None and resets + 1 > reset_limit:
        return Decision(Action.FAIL, reason=f"reset limit {reset_limit} exceeded: {what}")
    reason = f"reset {resets + 1}: {what}"
    if failed_hosts:
        reason += f"; blacklisting hosts {_names(failed_hosts)}"
    return Decision(Action.RESUME, blacklist=failed_hosts, reason=reason)


def decide_capacity(
    *,
    available_slots: int,
    min_np: int,
    waiting_since: float | None,
    now: float,
    elastic_timeout_s: float,
) -> CapacityAction:
    """Whether a round can be formed with ``available_slots``, or how long to keep waiting.

    PROCEED when at least ``min_np`` slots are available; otherwise WAIT until
    ``elastic_timeout_s`` has passed since ``waiting_since`` (``None``: waiting starts
    now), then TIMEOUT.
    """
    if available_slots >= min_np:
        return CapacityAction.PROCEED
    if waiting_since is None or now - waiting_since < elastic_timeout_s:
        return CapacityAction.WAIT
    return CapacityAction.TIMEOUT


_FINAL_STATES = frozenset({WorkerState.SUCCESS, WorkerState.FAILURE})


class WorkerRegistry:
    """The members of the current round and what each has reported."""

    def __init__(self) -> None:
        self._round_number = 0
        self._members: frozenset[WorkerId] = frozenset()
        self._states: dict[WorkerId, WorkerState] = {}
        self._removed: set[WorkerId] = set()
        self.reset_count = 0
        """How many times the job has reset (see :meth:`count_reset`)."""

    @property
    def round_number(self) -> int:
        """The current round (0 before the first round starts)."""
        return self._round_number

    def start_round(self, round_number: int, members: Iterable[WorkerId]) -> None:
        """Start recording ``round_number`` (greater than the current one) for ``members``,
        forgetting everything recorded for the previous round."""
        if round_number <= self._round_number:
            raise ValueError(
                f"round {round_number} must come after the current round {self._round_number}"
            )
        self._round_number = round_number
        self._members = frozenset(members)
        self._states = {}
        self._removed = set()
        logger.debug("round %d has %d members", round_number, len(self._members))

    def record(self, worker: WorkerId, state: WorkerState) -> bool:
        """Record that ``worker`` reported ``state``; return whether it was recorded.

        Reports of workers outside the round are ignored. SUCCESS and FAILURE are final: a
        later report of the same worker is ignored; a READY can be overridden.
        """
        if worker not in self._members:
            logger.debug(
                "ignoring %s from %s: not a member of round %d", state, worker, self._round_number
            )
            return False
        previous = self._states.get(worker)
        if previous in _FINAL_STATES:
            if previous is not state:
                logger.debug("ignoring %s from %s: it already reported %s", state, worker, previous)
            return False
        self._states[worker] = state
        return True

    def mark_removed(self, workers: Iterable[WorkerId]) -> None:
        """Mark members of the round as leaving gracefully (non-members are ignored)."""
        self._removed.update(w for w in workers if w in self._members)

    def records(self) -> RoundRecords:
        """A snapshot of the current round's records."""
        return RoundRecords(
            members=self._members,
            states=MappingProxyType(dict(self._states)),
            removed=frozenset(self._removed),
        )

    def failed_hosts(self) -> frozenset[str]:
        """The hosts of the members (not removed) that reported FAILURE."""
        return frozenset(
            w.hostname
            for w, state in self._states.items()
            if state is WorkerState.FAILURE and w not in self._removed
        )

    def count_reset(self) -> int:
        """Count one more reset of the job; return the new :attr:`reset_count`."""
        self.reset_count += 1
        return self.reset_count
