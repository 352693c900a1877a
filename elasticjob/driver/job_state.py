"""What a job's record keeps for the next driver of the job: :class:`JobState`, the one durable
account a driver resumes from (an operator that restarted, another replica that came to lead,
a suspended job that resumes), versioned with the record.

The state holds what a new driver cannot learn again from the workers: how often the job was
reset and restarted (the limits count them), the step of rank 0's newest commit (a durable
fallback counts its lost steps from it), the time lost by cause and the time suspended (the
goodput covers the whole job), the blacklisting in force with its wall-clock ends, and the
round in force with its members and the newest notice (its workers train on undisturbed).
:func:`job_state` builds it from the driver's read model; only the journal writes it into the
record (``journal.py``). The job's status shows the same facts; it is output, never read back.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Final, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from elasticjob.driver.goodput import LostTo

if TYPE_CHECKING:  # the snapshot's module reaches the record's, which holds this state
    from elasticjob.driver.job_snapshot import JobSnapshot

STATE_VERSION: Final = 1
"""The version of :class:`JobState` this module writes (and the only one it reads)."""

_Finite = Annotated[float, Field(allow_inf_nan=False)]
_Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _State(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BlacklistEntry(_State):
    """``key`` (a host, node or pod) is kept out until ``until`` (wall time, seconds since the
    epoch, rounded up so that a restored end never comes early), after ``strikes``
    blacklistings."""

    key: str
    until: _Finite
    strikes: Annotated[int, Field(ge=1)] = 1


class RoundMember(_State):
    """A host of the round in force and its ranks."""

    host: str
    ranks: tuple[Annotated[int, Field(ge=0)], ...]


class RoundInForce(_State):
    """The round a job's workers train in, as a new driver adopts it."""

    round: Annotated[int, Field(ge=1)]
    members: tuple[RoundMember, ...]
    notice_seq: Annotated[int, Field(ge=0)] = 0
    """The newest notice the members were given (a new driver numbers on after it)."""


class JobState(_State):
    """The durable account of a job (see the module docstring)."""

    version: Literal[1] = STATE_VERSION
    resets: Annotated[int, Field(ge=0)] = 0
    restarts: Annotated[int, Field(ge=0)] = 0
    """Resets that followed a failure (what the restart limit counts)."""
    last_reset_reason: str | None = None
    committed_step: Annotated[int, Field(ge=0)] | None = None
    running_seconds: _Seconds = 0.0
    """Wall time the job ran (suspensions left out) when the state was written."""
    lost_seconds: Mapping[LostTo, _Seconds] = {}
    """Of ``running_seconds``, the time lost by cause (see ``goodput.py``)."""
    suspended_seconds: _Seconds = 0.0
    """Wall time the job spent suspended before its current run (or suspension)."""
    suspended_since: _Finite | None = None
    """When the suspension under way began (wall time; None: the job is not suspended)."""
    last_round: Annotated[int, Field(ge=0)] = 0
    """The number of the job's newest round (a resumed job numbers on after it)."""
    round: RoundInForce | None = None
    """The round in force (None: none trains, the job is starting, suspended or over)."""
    blacklist: tuple[BlacklistEntry, ...] = ()

    def suspended_for(self, wall_now: float) -> float:
        """The job's time suspended up to ``wall_now``, the suspension under way included."""
        since = self.suspended_since
        return self.suspended_seconds + (0.0 if since is None else max(wall_now - since, 0.0))


class Blacklisted(Protocol):
    """What :func:`job_state` reads of a job's blacklist (``blacklist.HostBlacklist``)."""

    def active(self) -> Mapping[str, float]: ...

    def strikes(self, key: str) -> int: ...


def job_state(
    snapshot: JobSnapshot,
    blacklist: Blacklisted,
    *,
    wall_now: float,
    suspended_seconds: float,
    suspended_since: float | None,
) -> JobState:
    """The state of the job whose driver knows ``snapshot`` and keeps out what ``blacklist``
    holds, at ``wall_now`` (the moment ``snapshot.now`` is on the driver's clock); the job
    spent ``suspended_seconds`` suspended before this run, and is suspended since
    ``suspended_since`` (None: it is not)."""
    now = snapshot.now
    lost = snapshot.lost_time
    over = snapshot.result is not None
    ranks = snapshot.ranks_by_host()
    in_force = None
    if not over and snapshot.round and ranks:
        members = sorted(ranks.items(), key=lambda item: item[1][0])
        in_force = RoundInForce(
            round=snapshot.round,
            members=tuple(RoundMember(host=host, ranks=tuple(r)) for host, r in members),
            notice_seq=snapshot.notice_seq,
        )
    return JobState(
        resets=snapshot.reset_count,
        restarts=snapshot.restart_count,
        last_reset_reason=snapshot.last_reset_reason,
        committed_step=snapshot.committed_step,
        running_seconds=round(max(now - lost.started_at, 0.0), 3),
        lost_seconds={cause: round(s, 3) for cause, s in lost.lost_seconds(now).items()},
        suspended_seconds=round(suspended_seconds, 3),
        suspended_since=suspended_since,
        last_round=snapshot.round,
        round=in_force,
        blacklist=blacklist_entries(blacklist, wall_now - now),
    )


def blacklist_entries(blacklist: Blacklisted, wall_offset: float) -> tuple[BlacklistEntry, ...]:
    """The blacklisting in force, by key, its monotonic ends moved to the wall clock by
    ``wall_offset`` (wall time minus the blacklist's clock, now) and rounded up."""
    return tuple(
        BlacklistEntry(
            key=key, until=math.ceil(until + wall_offset), strikes=max(1, blacklist.strikes(key))
        )
        for key, until in sorted(blacklist.active().items())
    )
