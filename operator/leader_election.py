"""Which operator replica leads: the decision of one election step, as client-go's leader
election makes it over a ``coordination.k8s.io/v1`` Lease.

Every replica reads the Lease each retry period and :func:`decide` says what it does next:

- the leader **renews** the Lease (its ``renewTime``); when it has not renewed it within the
  renew deadline it has **lost** leadership and stops acting at once, writing nothing;
- a candidate **acquires** the Lease when nobody holds it or when its holder has not renewed
  it for a lease duration, counted on the candidate's own clock from the moment it saw the
  record change (so that clocks of different machines need not agree);
- a replica that must not lead (its pod is not ready: workers cannot reach it through the
  Service, or it is stopping) **steps down**: it stops acting, then releases the Lease
  (empty holder) so that a standby takes over without waiting for the lease to run out.

The renew deadline is shorter than the lease duration: a leader that cannot renew stops acting
before any standby may take the Lease. Pure: the executor is ``leader_lease.py``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


@dataclass(frozen=True)
class ElectionSettings:
    """The timing of the election (the chart's ``leaderElection`` values)."""

    lease_duration_s: int = 3
    """How long a standby waits, after it last saw the Lease change, before it takes it (an
    integer: the Lease's ``leaseDurationSeconds``)."""
    renew_deadline_s: float = 2.0
    """How long the leader keeps acting without a successful renewal."""
    retry_period_s: float = 0.5
    """How often every replica reads (and the leader renews) the Lease."""

    def __post_init__(self) -> None:
        if not self.lease_duration_s > self.renew_deadline_s > self.retry_period_s > 0:
            raise ValueError(
                "leader election needs lease duration > renew deadline > retry period > 0, got "
                f"{self.lease_duration_s}, {self.renew_deadline_s} and {self.retry_period_s} s"
            )


@dataclass(frozen=True)
class SeenLease:
    """The Lease as a replica last read it."""

    holder: str
    """The holder's identity ("": nobody holds it)."""
    duration_s: int
    """Its ``leaseDurationSeconds``."""
    observed_at: float
    """When (this replica's monotonic clock) it first saw this version of the record."""


@dataclass(frozen=True)
class Candidate:
    """What a replica knows of itself."""

    identity: str
    eligible: bool
    """It may lead: its pod is ready (the Service routes workers to it) and it is not
    stopping."""
    leading: bool
    renewed_at: float | None = None
    """When it last wrote the Lease as its holder (monotonic; None: never)."""


class Move(enum.Enum):
    """What a replica does after one read of the Lease."""

    ACQUIRE = "acquire"
    """Write the Lease with itself as holder (creating it if there is none), then lead."""
    RENEW = "renew"
    """Write a new renew time into the Lease it holds."""
    WAIT = "wait"
    """Nothing this time (another leads, or the Lease could not be read)."""
    STEP_DOWN = "step down"
    """Stop acting, then release the Lease (holder emptied)."""
    LOST = "lost"
    """Stop acting at once; write nothing (another may hold the Lease already)."""


def decide(
    seen: SeenLease | None,
    me: Candidate,
    now: float,
    settings: ElectionSettings,
    *,
    read_failed: bool = False,
) -> Move:
    """The replica's move after reading the Lease (``seen`` None: the API server has none;
    ``read_failed``: it could not be read, which decides nothing but the renew deadline)."""
    if me.leading and (me.renewed_at is None or now - me.renewed_at >= settings.renew_deadline_s):
        return Move.LOST
    if not me.eligible:
        return Move.STEP_DOWN if me.leading else Move.WAIT
    if read_failed:
        return Move.WAIT
    if seen is None or seen.holder == "":
        return Move.ACQUIRE
    if seen.holder == me.identity:
        return Move.RENEW if me.leading else Move.ACQUIRE
    if now - seen.observed_at < seen.duration_s:
        return Move.LOST if me.leading else Move.WAIT
    return Move.ACQUIRE
