"""Which members of a round probe which: a small, deterministic set per worker.

When a collective blocks, a worker probes a few peers (a TCP connect to the probe listener
each one hosts) and reports those it cannot reach with its heartbeat; the driver then kills
a member that a majority of its probers cannot reach (``elasticjob.driver.partition``). The
service hands each member the endpoints of its targets with its round, and the driver asks
who probes whom; both use :func:`probe_targets`, so they agree.

A worker's targets are

- its two neighbours in the ring of the members of its local rank, ordered by cross rank
  (the members of one local rank are one per host, so both neighbours are on other hosts);
- rank 0, which holds the round's store: a member that cannot reach it cannot form the next
  round, whatever its neighbours see;

leaving out members on its own host: a network is cut per host (a pod's network namespace),
so probing a host-mate tells nothing. With one slot per host the rings are the ring of ranks.
Each worker probes at most :data:`~elasticjob.wire.protocol.MAX_PROBE_TARGETS` peers, so the work is
O(1) per worker, and every member on a host of its own ring has two probers on other hosts
(rank 0 has every member of another host); only rank 0 is probed by O(size) members, and only
while their collectives block.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from elasticjob.rendezvous.published_rounds import Endpoint, PublishedRound
from elasticjob.rendezvous.rendezvous_types import ProbeReport, Refusal, RequestRefused
from elasticjob.wire.messages import HeartbeatRequest, PeerEndpoint, SlotInfo, WorkerId

logger = logging.getLogger(__name__)


def probe_targets(slots: Mapping[WorkerId, SlotInfo]) -> dict[WorkerId, tuple[WorkerId, ...]]:
    """Every member's probe targets in a round (see the module docstring), in a fixed order:
    rank 0, then the previous and the next member of its ring. O(size)."""
    by_ring: dict[tuple[int, int], WorkerId] = {}
    rank0: WorkerId | None = None
    for worker, slot in slots.items():
        by_ring[(slot.local_rank, slot.cross_rank)] = worker
        if slot.rank == 0:
            rank0 = worker
    targets: dict[WorkerId, tuple[WorkerId, ...]] = {}
    for worker, slot in slots.items():
        ring = [
            by_ring.get((slot.local_rank, (slot.cross_rank + step) % slot.cross_size))
            for step in (-1, 1)
        ]
        chosen: list[WorkerId] = []
        for peer in (rank0, *ring):
            if peer is not None and peer.hostname != worker.hostname and peer not in chosen:
                chosen.append(peer)
        targets[worker] = tuple(chosen)
    return targets


def probers_of(targets: Mapping[WorkerId, tuple[WorkerId, ...]]) -> dict[WorkerId, set[WorkerId]]:
    """The members that probe each member, from :func:`probe_targets`' answer (a member no
    one probes is absent)."""
    probers: dict[WorkerId, set[WorkerId]] = {}
    for prober, peers in targets.items():
        for peer in peers:
            probers.setdefault(peer, set()).add(prober)
    return probers


def peer_endpoints(
    targets: Mapping[WorkerId, tuple[WorkerId, ...]], endpoints: Mapping[WorkerId, Endpoint]
) -> dict[WorkerId, tuple[PeerEndpoint, ...]]:
    """Each member's probe targets with the store endpoints they registered (a member that
    never registered with this service has none, and is not probed). Each member's
    :class:`PeerEndpoint` is built once, whoever probes it: O(size) models in all."""
    built: dict[WorkerId, PeerEndpoint | None] = {}

    def peer_endpoint(peer: WorkerId) -> PeerEndpoint | None:
        if peer in built:
            return built[peer]
        endpoint = endpoints.get(peer)
        built[peer] = found = (
            None
            if endpoint is None
            else PeerEndpoint(
                hostname=peer.hostname,
                local_rank=peer.local_rank,
                address=endpoint.address,
                store_port=endpoint.store_port,
                probe_port=endpoint.probe_port,
            )
        )
        return found

    return {
        worker: tuple(found for peer in peers if (found := peer_endpoint(peer)) is not None)
        for worker, peers in targets.items()
    }


def probe_report(
    current: PublishedRound | None, worker: WorkerId, request: HeartbeatRequest
) -> ProbeReport | None:
    """The heartbeat's probe report, validated against the round in force: None if it has
    none, or one of an older round (a worker still blocked in a round that has ended: the
    beat counts, the report no longer does). Raises :class:`RequestRefused` for a round newer
    than the current one, and for a report naming a peer the worker does not probe."""
    if request.round is None:
        return None
    number = 0 if current is None else current.number
    if request.round > number:
        raise RequestRefused(
            Refusal.FUTURE_ROUND,
            f"{worker} reports probes of round {request.round}, newer than round {number}",
        )
    if current is None or request.round < number or worker not in current.slots:
        logger.debug("dropping %s's probe report of round %d", worker, request.round)
        return None
    unreachable = frozenset(WorkerId(p.hostname, p.local_rank) for p in request.unreachable)
    if strangers := unreachable - set(current.targets.get(worker, ())):
        raise RequestRefused(
            Refusal.INVALID_REPORT,
            f"{worker} does not probe {', '.join(map(str, sorted(strangers)))} in round {number}",
        )
    return ProbeReport(number, unreachable)
