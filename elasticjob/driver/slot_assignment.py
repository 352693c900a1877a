"""Turning ordered hosts into per-process slots, and checking that a round can continue."""

from __future__ import annotations

import functools
import logging
from collections.abc import Collection, Mapping, Sequence
from types import MappingProxyType

from elasticjob.driver.driver_types import DriverError
from elasticjob.wire.messages import SlotInfo, WorkerId

logger = logging.getLogger(__name__)


class NotEnoughSlotsError(DriverError):
    """Fewer slots are available than the job's minimum number of processes."""


def assign_slots(
    hosts: Sequence[tuple[str, int]], *, min_np: int, max_np: int | None
) -> Mapping[WorkerId, SlotInfo]:
    """Place one process per slot, walking ``hosts`` in order, up to ``max_np`` processes.

    Ranks are consecutive across hosts in their order; ``local_rank`` counts a host's
    processes and ``local_size`` is how many it got; ``cross_rank`` is the index of the host
    among the hosts that have a process with the same local rank, ``cross_size`` their
    number. The result is in rank order. Raises :class:`NotEnoughSlotsError` when the hosts
    have fewer than ``min_np`` slots in all.

    The result is read-only and shared by calls with equal arguments: the driver plans on
    each of its steps, and building 1,024 slots every time was most of a step's cost.
    """
    return _assign_slots(tuple(hosts), min_np, max_np)


@functools.lru_cache(maxsize=16)
def _assign_slots(
    hosts: tuple[tuple[str, int], ...], min_np: int, max_np: int | None
) -> Mapping[WorkerId, SlotInfo]:
    if min_np < 1:
        raise ValueError(f"min_np must be at least 1, got {min_np}")
    if max_np is not None and max_np < min_np:
        raise ValueError(f"max_np ({max_np}) must not be less than min_np ({min_np})")
    names = [host for host, _ in hosts]
    if len(set(names)) != len(names):
        raise ValueError(f"hosts must be distinct, got {names}")
    for host, slots in hosts:
        if slots < 1:
            raise ValueError(f"host {host} must have at least 1 slot, got {slots}")
    available = sum(slots for _, slots in hosts)
    if available < min_np:
        raise NotEnoughSlotsError(
            f"{available} slots available on {len(hosts)} hosts, "
            f"but the job needs at least {min_np} processes (min_np)"
        )
    size = available if max_np is None else min(available, max_np)
    local_sizes: dict[str, int] = {}
    placed = 0
    for host, slots in hosts:
        if placed == size:
            break
        local_sizes[host] = min(slots, size - placed)
        placed += local_sizes[host]
    # cross_sizes[r]: how many hosts have a process of local rank r.
    cross_sizes = [0] * max(local_sizes.values())
    for local_size in local_sizes.values():
        for local_rank in range(local_size):
            cross_sizes[local_rank] += 1
    next_cross_rank = [0] * len(cross_sizes)
    assignment: dict[WorkerId, SlotInfo] = {}
    for host, local_size in local_sizes.items():
        for local_rank in range(local_size):
            assignment[WorkerId(host, local_rank)] = SlotInfo(
                hostname=host,
                rank=len(assignment),
                local_rank=local_rank,
                cross_rank=next_cross_rank[local_rank],
                size=size,
                local_size=local_size,
                cross_size=cross_sizes[local_rank],
            )
            next_cross_rank[local_rank] += 1
    logger.debug("assigned %d slots on %d hosts", size, len(local_sizes))
    return MappingProxyType(assignment)


def round_hosts(slots: Mapping[WorkerId, SlotInfo]) -> tuple[tuple[str, int], ...]:
    """The hosts of a round's ``slots`` (in rank order) with the slots each got, in order."""
    hosts: dict[str, int] = {}
    for worker in slots:
        hosts[worker.hostname] = hosts.get(worker.hostname, 0) + 1
    return tuple(hosts.items())


def missing_survivor(
    survivors: Collection[WorkerId] | None, slots: Sequence[WorkerId]
) -> str | None:
    """Why the next round, with ``slots`` in rank order, cannot continue the previous round
    from memory; None if it can.

    ``survivors``: the workers of the previous round whose processes live on with its
    state (None: there was no previous round to continue, a first round). The next round
    syncs from its rank 0, so rank 0 must be one of them: a fresh process on a host of the
    previous round is no survivor. Hosts are ordered oldest first, so rank 0 is a survivor
    whenever a survivor's host is in the round.
    """
    if survivors is None or (slots and slots[0] in survivors):
        return None
    rank0 = f"its rank 0 would be the fresh process {slots[0]}" if slots else "no worker can start"
    if not survivors:
        return f"no worker of the previous round survives to hold the trained state ({rank0})"
    return (
        f"the next round cannot keep the trained state: {rank0}, not one of the previous "
        f"round's survivors ({', '.join(map(str, sorted(survivors)))})"
    )
