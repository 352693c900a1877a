"""Which members of a round are cut off from their peers: the decision, as a pure function.

A worker cut off from everything stops heartbeating and is killed as hung
(``liveness.py``). A worker cut off only from its peers (it still reaches the rendezvous
service) keeps beating; without more, every rank would block in its collective until the
collective timeout, and the next round would take the cut-off worker in again. So a worker
whose collective has blocked for a while probes a few peers (``elasticjob.rendezvous.probes``:
rank 0 and its ring neighbours on other hosts) and reports those it cannot reach with its
heartbeats. From those reports :func:`partitioned_members` decides whom to kill:

- only reports of the round in force that arrived within ``max_age_s`` count (a report of an
  older round says nothing about this one; a worker that stopped reporting got unstuck, or
  stopped beating and is killed as hung);
- a member is partitioned when a strict majority of **all** the members that probe it report
  it unreachable. Not of those that reported so far: reports arrive over a heartbeat interval,
  and the cut-off worker reports every peer it probes; counting only early reporters would let
  its one report condemn a healthy neighbour whose other prober has not reported yet. A member
  on a host of its own ring has two probers, so both must agree; rank 0 needs more than half
  of the members of the other hosts;
- members are judged from the highest rank down, and the reports of a member already judged
  partitioned no longer count as votes (its probers still count in the majority's base). So
  when two members report each other, as the two members of a round of two do, the one of
  the lower rank stays: rank 0 holds the round's store and, hosts being ordered oldest
  first, the freshest state. Two cut-off members a host apart do not condemn the healthy one
  between them: one vote of its two probers no longer counts.

A partition that isolates no host from a majority of its probers (a cut between two healthy
halves, a single broken link) kills nobody here: the collective timeout still ends it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from elasticjob.rendezvous.probes import probe_targets, probers_of
from elasticjob.wire.messages import SlotInfo, WorkerId


@dataclass(frozen=True)
class ReceivedReport:
    """A member's latest probe report, as the driver received it."""

    round: int
    unreachable: frozenset[WorkerId]
    received_at: float


@dataclass(frozen=True)
class Partitioned:
    """A member to kill, and the members whose reports condemned it."""

    worker: WorkerId
    reported_by: tuple[WorkerId, ...]


def partitioned_members(
    reports: Mapping[WorkerId, ReceivedReport],
    slots: Mapping[WorkerId, SlotInfo],
    *,
    round_number: int,
    now: float,
    max_age_s: float,
) -> list[Partitioned]:
    """The members of round ``round_number`` (with ``slots``) that their peers cannot reach,
    from the highest rank down (see the module docstring). ``reports``: the latest report of
    each worker; reports of non-members, of other rounds and older than ``max_age_s`` are
    ignored."""
    counted = {
        worker: report
        for worker, report in reports.items()
        if worker in slots
        and report.round == round_number
        and now - report.received_at <= max_age_s
        and report.unreachable
    }
    if not counted:
        return []
    probers = probers_of(probe_targets(slots))
    found: list[Partitioned] = []
    condemned: set[WorkerId] = set()
    for worker in sorted(slots, key=lambda w: slots[w].rank, reverse=True):
        its_probers = probers.get(worker, set())
        votes = tuple(
            sorted(
                prober
                for prober in its_probers
                if prober not in condemned
                and prober in counted
                and worker in counted[prober].unreachable
            )
        )
        if 2 * len(votes) > len(its_probers):
            found.append(Partitioned(worker, votes))
            condemned.add(worker)
    return found
