"""What follows the failure of one process of a host that lives on (a pod's slot, whose slot
supervisor saw it end; under ``elasticjob-run``, a process its launcher saw exit): a pure
plan, no I/O.

Two ways back, measured in the state the round's ranks move to resume, as fractions of one
replica's state (what the workers said they hold, ``HeldShards``):

- **Drop the host** (:attr:`SlotLossAction.DROP_HOST`, what every other failure does): its
  other slots end with it, it is struck and replaced, and the survivors go on without its
  ranks. Nothing moves where the ranks left hold every shard whole: a replicated state, or
  HSDP with other replicas (the lost pod's replica is refilled later, by a new pod). A
  one-dimensional sharded state is resharded onto the ranks left.
- **Restart the slot in place** (:attr:`SlotLossAction.RESTART_SLOT`): its siblings keep
  their processes and shards, a fresh process takes the slot, and the world keeps its size
  and layout: only the lost rank's shard moves, from another replica or a copy.

The plan takes the one that moves less; with equal moves, the host is dropped, so that the
survivors resume without waiting for a process to start. The slot is never restarted where it
was rank 0 (the next round's rank 0 must be a survivor), where no sibling of it lives (the
host is lost, not one process), where no sharded state says what it holds, where no other
rank holds its shard, or where its host's slots were restarted :data:`MAX_SLOT_RESTARTS`
times already (a host that keeps failing is struck, as any other).
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from elasticjob.driver.rank_placement import kept_rows
from elasticjob.wire.messages import HeldShards, WorkerId

MAX_SLOT_RESTARTS = 3
"""How many times one host's slots are restarted in place over a job; its next failure drops
it."""


class SlotLossAction(enum.Enum):
    DROP_HOST = "drop-host"
    RESTART_SLOT = "restart-slot"


@dataclass(frozen=True)
class SlotLoss:
    """The plan: what to do and why, and what each way back would move (as fractions of one
    replica's state; None: that way cannot keep every shard, or does not apply)."""

    action: SlotLossAction
    reason: str
    drop_moves: Fraction | None = None
    restart_moves: Fraction | None = None

    @property
    def restarts(self) -> bool:
        return self.action is SlotLossAction.RESTART_SLOT


def _drop(reason: str) -> SlotLoss:
    return SlotLoss(SlotLossAction.DROP_HOST, reason)


def decide_slot_loss(
    lost: WorkerId,
    members: Sequence[WorkerId],
    alive: Collection[WorkerId],
    held: Mapping[WorkerId, HeldShards],
    *,
    host_restarts: int,
) -> SlotLoss:
    """What follows the failure of ``lost``, a member of the round whose ``members`` are
    given in rank order; ``alive``: the members whose processes still run (``lost`` aside);
    ``held``: what the members hold of the sharded state's commit; ``host_restarts``: how
    many times ``lost``'s host had a slot restarted in place already."""
    if lost not in members:
        return _drop("it is not a member of the round")
    if members[0] == lost:
        return _drop("it was rank 0, which the next round takes from a survivor")
    siblings = [m for m in members if m.hostname == lost.hostname and m != lost and m in alive]
    if not siblings:
        return _drop("no other process of its host lives on")
    if host_restarts >= MAX_SLOT_RESTARTS:
        return _drop(f"its host's slots were restarted {host_restarts} times already")
    mine = held.get(lost)
    if mine is None:
        return _drop("no sharded state: the ranks left hold the whole state")
    others = {m: held[m] for m in members if m in alive and m != lost and m in held}
    restart = _restart_moves(mine, others)
    drop = _drop_moves(mine, {m: h for m, h in others.items() if m.hostname != lost.hostname})
    if restart is None:
        return SlotLoss(SlotLossAction.DROP_HOST, "no other rank holds its shard", drop, restart)
    if drop is not None and drop <= restart:
        return SlotLoss(
            SlotLossAction.DROP_HOST,
            f"the ranks left move {drop} of a replica, its slot's restart {restart}",
            drop,
            restart,
        )
    left = "cannot keep every shard" if drop is None else f"moves {drop} of a replica"
    return SlotLoss(
        SlotLossAction.RESTART_SLOT,
        f"its slot's restart moves {restart} of a replica; dropping its host {left}",
        drop,
        restart,
    )


def _restart_moves(mine: HeldShards, others: Mapping[WorkerId, HeldShards]) -> Fraction | None:
    """A fresh process in the lost slot takes the lost rank's shard from another rank."""
    if any(h.shards == mine.shards and mine.own in h.held for h in others.values()):
        return Fraction(1, mine.shards)
    return None


def _drop_moves(mine: HeldShards, left: Mapping[WorkerId, HeldShards]) -> Fraction | None:
    """The ranks ``left`` once the lost rank's host is gone, resharded onto themselves: HSDP
    moves nothing where they own every shard (whole replicas), and is not planned otherwise
    (its shard size would change); a one-dimensional state keeps each rank's old rows that
    are its new ones (``rank_placement.kept_rows``, the ranks in the order of their shards)."""
    if not left or any(h.shards != mine.shards or h.hsdp != mine.hsdp for h in left.values()):
        return None
    if mine.hsdp:
        return Fraction(0) if {h.own for h in left.values()} == set(range(mine.shards)) else None
    if {s for h in left.values() for s in h.held} != set(range(mine.shards)):
        return None
    world = len(left)
    ranked = sorted(left.values(), key=lambda h: h.own)
    kept = sum(kept_rows(h, rank, world) for rank, h in enumerate(ranked))
    return 1 - Fraction(kept, mine.shards * world)
