"""Stragglers: a member whose steps are consistently slower than the rest of its round (a pure
decision, table-tested).

In synchronous training every rank's step takes as long as the slowest one's, so wall time
says nothing about who is slow. What differs is how long each rank waits for the others in
the step's collectives: the straggler arrives last and waits least. Every worker reports,
with its heartbeat, its *busy* time per step (the step's wall time less the time it waited
in collectives), as the median of its recent steps in the round
(:class:`~elasticjob.wire.messages.StepPace`); the driver keeps the newest report of each
member.

The rule (:func:`find_stragglers`, with the job's :class:`StragglerPolicy`): a member is
*slow* when its busy time is at least ``slowdown`` times the median of the other members' and
longer by at least :data:`MIN_EXCESS_S`; it is *flagged* once it has been slow for ``for_s``
without a break.
Nothing counts before a member has measured :data:`MIN_STEPS` steps of the round (its first
steps warm up: allocator, caches, the first collectives), nor with fewer than two members
reporting. The median of the last steps, and the time to stay slow, make one slow step (a
checkpoint, a garbage collection) never flag anyone.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from elasticjob.wire.messages import StepPace, WorkerId

MIN_STEPS: Final = 20
"""Steps a member must have measured in the round before its pace counts."""
MIN_EXCESS_S: Final = 0.005
"""How much longer than the others' a slow member's busy time must be, in seconds: below it,
steps are too short for a ratio to mean anything."""


@dataclass(frozen=True)
class StragglerPolicy:
    """When a member is a straggler, and what follows (a job's settings)."""

    slowdown: float = 1.5
    """Busy time per step, as a multiple of the other members' median, from which a member
    is slow."""
    for_s: float = 60.0
    """How long a member must stay slow to be flagged."""
    replace: bool = False
    """A flagged member is replaced: its host is blacklisted (the usual cooldown) and it
    leaves at the next check, without rollback; the front end starts a new worker elsewhere.
    False: it is only reported."""

    def __post_init__(self) -> None:
        if self.slowdown <= 1.0:
            raise ValueError(f"slowdown must be > 1, got {self.slowdown}")
        if self.for_s < 0:
            raise ValueError(f"for_s must be >= 0, got {self.for_s}")


@dataclass(frozen=True)
class Straggler:
    """A member found slow: since when, and how much slower than the others it is."""

    since: float
    slowdown: float
    flagged: bool
    """It has been slow for the rule's ``for_s``."""


def find_stragglers(
    paces: Mapping[WorkerId, StepPace | None],
    current_round: int,
    before: Mapping[WorkerId, Straggler],
    rule: StragglerPolicy,
    now: float,
) -> dict[WorkerId, Straggler]:
    """The slow members of round ``current_round`` now, given each member's newest pace
    (None: none reported yet) and the slow members found before (``before``: when each
    became slow). A member that is not slow now is left out: its time starts again."""
    counted = {
        worker: pace.busy_s
        for worker, pace in paces.items()
        if pace is not None and pace.round == current_round and pace.steps >= MIN_STEPS
    }
    if len(counted) < 2:
        return {}
    found = {}
    for worker, busy in counted.items():
        others = statistics.median(b for w, b in counted.items() if w != worker)
        if busy < others * rule.slowdown or busy - others < MIN_EXCESS_S:
            continue
        earlier = before.get(worker)
        since = earlier.since if earlier is not None else now
        slowdown = busy / max(others, MIN_EXCESS_S)
        found[worker] = Straggler(since, round(slowdown, 2), now - since >= rule.for_s)
    return found
