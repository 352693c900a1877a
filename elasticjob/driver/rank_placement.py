"""Where a round's hosts go in rank order when its survivors hold a one-dimensional sharded
state: a pure plan, no I/O.

FSDP over every rank gives rank ``r`` of a world of ``m`` the ``r``-th of ``m`` equal shards of
every tensor (rows ``[r/m, (r+1)/m)`` of it, as fractions). After the world changes, a rank
keeps the rows of its new shard that it already holds (its own old shard and the copies it
keeps of others, ``HeldShards``), and every other row is sent to it. Hosts ordered oldest
first put a scale-out's newcomers last, which shifts every survivor's shard towards the
start: from 2 to 3 ranks, the survivors then keep 3 of the 6 sixths where they could keep 4
with the newcomer between them.

:func:`place_hosts` orders the round's hosts so that the survivors keep the most rows:
survivors' hosts keep their order (by the shards they held), newcomers' hosts keep theirs
(oldest first), and the two are interleaved where that moves the fewest rows; the first
host is a survivor's, whose first slot (rank 0) survived, as the round's sync needs. The
rows are counted in fractions of a tensor, exactly for tensors whose rows both worlds divide
(``torch.chunk`` rounds a shard's rows up otherwise).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from elasticjob.wire.messages import HeldShards, WorkerId

Hosts = tuple[tuple[str, int], ...]
"""``(host, slots)`` in rank order: a host's ranks are consecutive."""


def kept_rows(held: HeldShards, rank: int, world: int) -> int:
    """How many of rank ``rank``'s rows in a world of ``world`` a worker holding ``held``
    already holds, in units of ``1 / (held.shards * world)`` of a tensor's rows."""
    old = held.shards
    start, stop = rank * old, (rank + 1) * old
    return sum(
        max(0, min(stop, (shard + 1) * world) - max(start, shard * world)) for shard in held.held
    )


@dataclass(frozen=True)
class _Host:
    name: str
    slots: int
    held: dict[int, HeldShards]
    """What its surviving workers hold, by local rank (empty: a newcomer's host)."""

    def kept(self, first_rank: int, world: int) -> int:
        """The rows its survivors keep with its ranks starting at ``first_rank``."""
        return sum(
            kept_rows(held, first_rank + local, world)
            for local, held in self.held.items()
            if local < self.slots
        )


def place_hosts(hosts: Sequence[tuple[str, int]], held: Mapping[WorkerId, HeldShards]) -> Hosts:
    """The round's ``hosts`` (``(host, slots)``, oldest first, each with the slots it gets)
    in the rank order that keeps the most rows where they are, given what the survivors hold
    of the previous round's commit (``held``). The hosts as they are where there is nothing
    to place: no survivor holds shards, they disagree on the shard count, the state is HSDP
    (a new replica takes a replica's shards wherever it goes), or no survivor's host has its
    first slot left to be rank 0."""
    order = tuple((name, slots) for name, slots in hosts)
    counts = {h.shards for h in held.values()}
    if len(counts) != 1 or any(h.hsdp for h in held.values()):
        return order
    by_host: dict[str, dict[int, HeldShards]] = {}
    for worker, shards in held.items():
        by_host.setdefault(worker.hostname, {})[worker.local_rank] = shards
    every = [_Host(name, slots, by_host.get(name, {})) for name, slots in order]
    fresh = [host for host in every if not host.held]
    kept = sorted((host for host in every if host.held), key=_first_shard)
    if not kept or 0 not in kept[0].held:
        return order
    if not fresh:
        return tuple((host.name, host.slots) for host in kept)
    world = sum(slots for _, slots in order)
    return tuple((host.name, host.slots) for host in _interleave(kept, fresh, world))


def _first_shard(host: _Host) -> int:
    return min(h.own for h in host.held.values())


def _interleave(kept: list[_Host], fresh: list[_Host], world: int) -> list[_Host]:
    """The interleaving of ``kept`` and ``fresh`` (each in its order), ``kept[0]`` first,
    whose survivors keep the most rows; among equals, survivors' hosts as early as they can
    go (newcomers last, as by age)."""
    # best[i, j]: the most rows kept with the first i survivors' and j newcomers' hosts
    # placed, and whether a newcomer's host went last to get there.
    kept_slots = [0, *itertools.accumulate(h.slots for h in kept)]
    fresh_slots = [0, *itertools.accumulate(h.slots for h in fresh)]
    best: dict[tuple[int, int], tuple[int, bool]] = {(1, 0): (kept[0].kept(0, world), False)}
    for i in range(1, len(kept) + 1):
        for j in range(len(fresh) + 1):
            options = []
            if (i - 1, j) in best:
                start = kept_slots[i - 1] + fresh_slots[j]
                options.append((best[i - 1, j][0] + kept[i - 1].kept(start, world), False))
            if j and (i, j - 1) in best:
                options.append((best[i, j - 1][0], True))
            if options and (i, j) != (1, 0):
                best[i, j] = max(options)
    placed: list[_Host] = []
    i, j = len(kept), len(fresh)
    while (i, j) != (0, 0):
        if best[i, j][1]:
            j -= 1
            placed.append(fresh[j])
        else:
            i -= 1
            placed.append(kept[i])
    return placed[::-1]
