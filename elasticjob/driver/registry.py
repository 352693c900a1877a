"""What the members of the current round reported.

:class:`WorkerRegistry` keeps the records; what the driver does about them is decided in
``decisions.py`` (:func:`~elasticjob.driver.decisions.decide_round`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from elasticjob.wire.messages import ScriptExit, WorkerId, WorkerState

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RoundRecords:
    """What the members of one round have reported so far."""

    members: frozenset[WorkerId]
    states: Mapping[WorkerId, WorkerState] = field(default_factory=dict)
    """The latest state each worker reported (workers that reported nothing are absent)."""
    leaving: frozenset[WorkerId] = frozenset()
    """Members leaving gracefully (scale-in, preemption; see ``Departure.LEAVING``): their
    states and absence are ignored, and their failure is never a failure of the job."""
    rolled_back: frozenset[WorkerId] = frozenset()
    """Members that rolled back to their last commit after a collective failed on them."""
    script_exits: Mapping[WorkerId, ScriptExit] = field(default_factory=dict)
    """Members whose script failed on its own (elastic mode: it raised; restart mode: it
    exited non-zero or was killed by a signal its agent did not send), in the order they
    said so."""


_FINAL_STATES = frozenset({WorkerState.SUCCESS, WorkerState.FAILURE})


class WorkerRegistry:
    """What the members of the current round reported."""

    def __init__(
        self, members: Callable[[], Collection[WorkerId]], current_round: Callable[[], int]
    ) -> None:
        """``members`` and ``current_round``: the members and the number of the round in
        force, read from their owner (the job's rendezvous) whenever needed. What was recorded
        is forgotten once another round is in force."""
        self._members = members
        self._current_round = current_round
        self._recorded_round = 0
        """The round whose reports are recorded."""
        self._states: dict[WorkerId, WorkerState] = {}
        self._rolled_back: set[WorkerId] = set()
        self._script_exits: dict[WorkerId, ScriptExit] = {}
        self.reset_count = 0
        """How many times the job has reset (see :meth:`count_reset`)."""
        self.restart_count = 0
        """How many of those resets followed a failure (see :meth:`count_reset`)."""
        self._failures_at_commit: tuple[int | None, int] | None = None
        """The newest commit's step when the latest failed round ended, and how many failed
        rounds in a row ended with it the newest (None: no round has failed)."""

    def _of_current_round(self) -> None:
        """Forget what was recorded for a round that is no longer in force."""
        number = self._current_round()
        if number != self._recorded_round:
            self._recorded_round = number
            self._states = {}
            self._rolled_back = set()
            self._script_exits = {}
            logger.debug("round %d has %d members", number, len(self._members()))

    def record(self, worker: WorkerId, state: WorkerState) -> bool:
        """Record that ``worker`` reported ``state``; return whether it was recorded.

        Reports of workers outside the round are ignored. SUCCESS and FAILURE are final: a
        later report of the same worker is ignored; a READY can be overridden.
        """
        self._of_current_round()
        if worker not in self._members():
            logger.debug(
                "ignoring %s from %s: not a member of round %d", state, worker, self._recorded_round
            )
            return False
        previous = self._states.get(worker)
        if previous in _FINAL_STATES:
            if previous is not state:
                logger.debug("ignoring %s from %s: it already reported %s", state, worker, previous)
            return False
        self._states[worker] = state
        return True

    def mark_rolled_back(self, worker: WorkerId) -> None:
        """Record that a member rolled back after a collective failed on it (a non-member is
        ignored)."""
        self._of_current_round()
        if worker in self._members():
            self._rolled_back.add(worker)

    def record_script_exit(self, worker: WorkerId, script_exit: ScriptExit) -> None:
        """Record how a member's script failed on its own (a non-member, or a second report
        of the same member, is ignored)."""
        self._of_current_round()
        if worker in self._members():
            self._script_exits.setdefault(worker, script_exit)

    def any_succeeded(self) -> bool:
        """Whether a member of the current round finished its training (reported or exited
        with success)."""
        self._of_current_round()
        return WorkerState.SUCCESS in self._states.values()

    def records(self, leaving: Collection[WorkerId] = ()) -> RoundRecords:
        """A snapshot of the current round's records; ``leaving``: the workers leaving
        gracefully (those that are members count as leaving)."""
        self._of_current_round()
        members = frozenset(self._members())
        return RoundRecords(
            members=members,
            states=MappingProxyType(dict(self._states)),
            leaving=members & frozenset(leaving),
            rolled_back=frozenset(self._rolled_back),
            script_exits=MappingProxyType(dict(self._script_exits)),
        )

    def failed_rounds_without_commit(self, committed_step: int | None) -> int:
        """How many rounds in a row failed with ``committed_step`` (the newest commit's step,
        None: nothing committed yet) the newest commit: 0 when a commit came after the last
        failed round, or none failed."""
        if self._failures_at_commit is None or self._failures_at_commit[0] != committed_step:
            return 0
        return self._failures_at_commit[1]

    def count_reset(self, *, after_failure: bool, committed_step: int | None) -> int:
        """Count one more reset of the job, and one more restart if it follows a failure
        (one more failed round without a commit, if ``committed_step`` is still the step of
        the newest commit when the last round failed); return the new :attr:`reset_count`."""
        self.reset_count += 1
        self.restart_count += after_failure
        if after_failure:
            failed = self.failed_rounds_without_commit(committed_step) + 1
            self._failures_at_commit = (committed_step, failed)
        return self.reset_count
