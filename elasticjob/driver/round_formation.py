"""Forming the driver's rounds: carries out what ``planning.py`` decides about the next round
(its slots, launching its missing workers, when to publish it) and about a running round's
newcomers (launch them, announce them once all registered). The driver publishes what this
returns (:meth:`RoundFormation.next_round`) and owns the round's state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from elasticjob.driver.driver_types import Clock, DriverSettings
from elasticjob.driver.host_manager import Capacity, HostManager
from elasticjob.driver.journal import JobJournal
from elasticjob.driver.planning import (
    AwaitCapacity,
    EndJob,
    FormRound,
    NextRound,
    Publish,
    ScaleOutAction,
    decide_formation,
    decide_scale_out,
    plan_round,
)
from elasticjob.driver.workers import WorkerProcesses
from elasticjob.rendezvous.rendezvous_types import JobRendezvous
from elasticjob.wire.messages import HeldShards, NoticeKind, SlotInfo, WorkerId

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FormationMoves:
    """What forming a round asks of the driver."""

    exited: Callable[[WorkerId, int], object]
    """A worker's process ended with this status (it could not be started: 127)."""
    blacklist: Callable[[Iterable[str]], None]
    """Keep these hosts out (their newcomers did not register in time)."""
    wake: Callable[[], None]
    """Step again soon (plan without the hosts just blacklisted)."""
    post_notice: Callable[[NoticeKind, Iterable[str]], None]
    """Tell the round's members of hosts added (the driver's one way to post a notice)."""


class RoundFormation:
    """Plans and prepares the next round of one driver, and a running round's newcomers."""

    def __init__(
        self,
        hosts: HostManager,
        settings: DriverSettings,
        workers: WorkerProcesses,
        rendezvous: JobRendezvous,
        journal: JobJournal,
        clock: Clock,
        moves: FormationMoves,
    ) -> None:
        self._hosts = hosts
        self._settings = settings
        self._workers = workers
        self._rendezvous = rendezvous
        self._journal = journal
        self._clock = clock
        self._moves = moves
        self._waiting_since: float | None = None
        """Since when the round being formed waits for capacity (None: it does not)."""
        self._from_checkpoint = False
        """The round being formed starts from the newest checkpoint (no survivor)."""
        self._announced = False
        """The running round's newcomers were announced (HOSTS_ADDED)."""
        self._scale_out_plan: tuple[Capacity, dict[WorkerId, HeldShards], NextRound] | None = None
        """The capacity and the members' shards a running round's scale-out was last planned
        for, and the plan."""

    def round_ended(self) -> None:
        """The round in force ended: the wait for capacity starts afresh."""
        self._waiting_since = None

    def published(self) -> None:
        """A round was published: its newcomers are members, nothing is announced yet."""
        self._from_checkpoint = False
        self._announced = False

    async def next_round(
        self, current_round: int, survivors: set[WorkerId] | None, recovering: bool
    ) -> EndJob | Publish | None:
        """Plan the round after ``current_round`` (``survivors``: the members of the round in
        force that live on with its state; None for a first round), launch its missing
        workers, and return what to publish once every member is at the barrier; an
        :class:`EndJob` when no round can be formed; None while waiting."""
        plan = plan_round(
            self._hosts.capacity(),
            self._settings,
            survivors=survivors,
            waiting_since=self._waiting_since,
            now=self._clock(),
            held=self._workers.held_shards(survivors or ()),
        )
        if isinstance(plan, EndJob):
            return plan
        if isinstance(plan, AwaitCapacity):
            if self._waiting_since is None:
                logger.warning("%s", plan.message)
            self._waiting_since = plan.since
            return None
        self._waiting_since = None
        if plan.from_checkpoint and not self._from_checkpoint:
            self._from_checkpoint = True
            logger.warning(
                "no worker of round %d survives: round %d starts %d fresh workers and its "
                "rank 0 loads the newest checkpoint",
                current_round,
                current_round + 1,
                len(plan.slots),
            )
            self._journal.fell_back(current_round)
        self._rendezvous.plan_next(current_round + 1, plan.slots)  # replacements' init() reads it
        await self._launch(plan.slots)
        formation = decide_formation(
            plan.slots, self._workers, current_round=current_round, recovering=recovering
        )
        return formation if isinstance(formation, Publish) else None

    async def scale_out(
        self, current_round: int, members: Mapping[WorkerId, SlotInfo], *, recovering: bool
    ) -> None:
        """While a round runs: launch workers for new hosts, announce them once registered."""
        capacity = self._hosts.capacity()
        held = self._workers.held_shards(members)
        if self._scale_out_plan is None or self._scale_out_plan[:2] != (capacity, held):
            # Without survivors or a wait, the plan depends on the capacity and on what the
            # members hold alone (only an AwaitCapacity, on which nothing scales out, holds
            # the time): planned once per change of those, not at every step of a running
            # job.
            plan = plan_round(
                capacity,
                self._settings,
                survivors=None,
                waiting_since=None,
                now=self._clock(),
                held=held,
            )
            self._scale_out_plan = capacity, held, plan
        plan = self._scale_out_plan[2]
        decision = decide_scale_out(
            plan,
            members,
            self._workers,
            leaving=bool(self._workers.leaving(members)),
            announced=self._announced,
            recovering=recovering,
        )
        if decision.action is ScaleOutAction.PREPARE:
            assert isinstance(plan, FormRound)
            self._rendezvous.plan_next(current_round + 1, plan.slots)  # newcomers' init() reads
            await self._launch({w: plan.slots[w] for w in decision.newcomers})
        elif decision.action is ScaleOutAction.ANNOUNCE:
            self._announced = True
            self._moves.post_notice(
                NoticeKind.HOSTS_ADDED, sorted({w.hostname for w in decision.newcomers})
            )

    async def _launch(self, slots: Mapping[WorkerId, SlotInfo]) -> None:
        """Start the missing workers of ``slots`` (planned), then stop the newcomers that did
        not register in time and keep their hosts out."""
        for worker in await self._workers.launch_missing(slots):
            self._moves.exited(worker, 127)
        expired = await self._workers.expire_slow_starters(self._settings.start_timeout_s)
        if expired:
            self._moves.blacklist({w.hostname for w in expired})
            self._moves.wake()
