"""The records of a job's rounds: the members of the round in force and the store endpoints
workers registered with."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field

from elasticjob.rendezvous.rendezvous_types import RendezvousError
from elasticjob.wire.messages import PeerEndpoint, SlotInfo, WorkerId


@dataclass(frozen=True)
class Endpoint:
    """Where a worker's TCPStore server and probe listener listen."""

    address: str
    store_port: int
    probe_port: int | None = None
    """None: a worker without a probe listener (a restart-mode agent)."""


@dataclass(frozen=True)
class Binding:
    """The store endpoint a worker registered with for the round after ``after_round``."""

    after_round: int
    endpoint: Endpoint


@dataclass(frozen=True)
class PublishedRound:
    """A round in force: its members, the store of its rank 0 and what it was published with."""

    number: int
    slots: Mapping[WorkerId, SlotInfo]
    store: Endpoint | None
    """None for an adopted round: its members formed their group before this process ran."""
    notice_seq: int
    sync: bool
    targets: Mapping[WorkerId, tuple[WorkerId, ...]] = field(default_factory=dict)
    """Whom each member probes (``probes.probe_targets``)."""
    peers: Mapping[WorkerId, tuple[PeerEndpoint, ...]] = field(default_factory=dict)
    """The endpoints of each member's probe targets, as they registered (empty for an adopted
    round: its members got theirs from the service before it restarted)."""

    @functools.cached_property
    def hosts(self) -> tuple[str, ...]:
        """The members' hosts in rank order, each once (worked out once per round: every
        starting worker asks for them)."""
        ranked = sorted(self.slots.values(), key=lambda slot: slot.rank)
        return tuple(dict.fromkeys(slot.hostname for slot in ranked))


def check_slots(slots: Mapping[WorkerId, SlotInfo]) -> WorkerId:
    """Return the rank-0 member, or raise if the slots are not ranks ``0..size-1``."""
    by_rank: dict[int, WorkerId] = {}
    for worker, slot in slots.items():
        if (slot.hostname, slot.local_rank) != (worker.hostname, worker.local_rank):
            raise RendezvousError(f"slot of {worker} names {slot.hostname}[{slot.local_rank}]")
        if slot.size != len(slots):
            raise RendezvousError(f"slot of {worker} has size {slot.size}, round has {len(slots)}")
        if slot.rank in by_rank:
            raise RendezvousError(f"rank {slot.rank} given to {by_rank[slot.rank]} and {worker}")
        by_rank[slot.rank] = worker
    missing = sorted(set(range(len(slots))) - by_rank.keys())
    if not slots or missing:
        raise RendezvousError(f"round must give every rank 0..size-1 once; missing {missing}")
    return by_rank[0]
