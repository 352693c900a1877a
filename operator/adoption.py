"""Taking a job over when its driver starts again (an operator restart, another replica
that came to lead, a suspended job that resumes), from the job's record (``job_state.py``):
the counts of resets and restarts, the account of lost time, the blacklisting in force until
its recorded ends, and the round in force (so its workers train on undisturbed); and which
objects are the job's at all (:func:`ownership`): only those the job controls by
ownerReference, never an object that merely carries its labels or name. Pure functions of the
record, the objects and the clocks, and :func:`resume_job`, which hands what the record holds
to a new driver. The job's status is never read back: it is output."""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from elasticjob.driver.driver import ElasticDriver
from elasticjob.driver.job_record import JobRecordData
from elasticjob.driver.job_state import BlacklistEntry, JobState
from elasticjob.driver.slot_assignment import assign_slots
from elasticjob.operator.api import KIND
from elasticjob.wire.messages import SlotInfo, WorkerId

logger = logging.getLogger(__name__)


class Ownership(enum.Enum):
    """Whose an object (a worker pod, the job's Secret) is, as far as a job can tell."""

    OWNED = "owned"
    """The job controls it: an ownerReference with ``controller: true`` and the job's uid."""
    STALE = "stale"
    """An earlier ElasticJob of the same name controls it; garbage collection removes it."""
    FOREIGN = "foreign"
    """Someone else made it (it may carry the job's labels or name all the same)."""


def ownership(obj: Mapping[str, Any], job: Mapping[str, Any]) -> Ownership:
    """Whose ``obj`` is, for ``job`` (both API objects as dicts)."""
    uid, name = job["metadata"]["uid"], job["metadata"]["name"]
    controllers = [
        ref
        for ref in (obj.get("metadata") or {}).get("ownerReferences") or []
        if ref.get("controller") is True
    ]
    if any(ref.get("uid") == uid for ref in controllers):
        return Ownership.OWNED
    if any(ref.get("kind") == KIND and ref.get("name") == name for ref in controllers):
        return Ownership.STALE
    return Ownership.FOREIGN


@dataclass(frozen=True)
class RecordedRound:
    """The round a job's record holds, as the driver adopts it."""

    round: int
    slots: Mapping[WorkerId, SlotInfo]
    notice_seq: int
    rank_order: tuple[str, ...]
    """Its pods by rank."""


def recorded_round(state: JobState, slots_per_worker: int) -> RecordedRound | None:
    """The round in force ``state`` holds, or None when there is none or it does not fit the
    pods' slots (then a new round is formed)."""
    in_force = state.round
    if in_force is None or not in_force.members:
        return None
    order = sorted(in_force.members, key=lambda m: min(m.ranks or (0,)))
    slots = assign_slots([(m.host, slots_per_worker) for m in order], min_np=1, max_np=None)
    recorded = {(m.host, rank) for m in in_force.members for rank in m.ranks}
    if {(worker.hostname, slot.rank) for worker, slot in slots.items()} != recorded:
        logger.warning("the recorded round %d does not fit its pods; not adopted", in_force.round)
        return None
    return RecordedRound(in_force.round, slots, in_force.notice_seq, tuple(m.host for m in order))


class Restorable(Protocol):
    """A blacklist that takes over recorded blacklistings (``blacklist.HostBlacklist``)."""

    def restore(self, key: str, until: float, strikes: int = 1) -> None: ...


def restore_blacklist(
    blacklist: Restorable, recorded: tuple[BlacklistEntry, ...], wall_now: float, mono_now: float
) -> None:
    """Blacklist the ``recorded`` keys again until their recorded (wall-clock) ends, on the
    blacklist's monotonic clock (``mono_now`` read from it at ``wall_now``), with their
    strikes. Ends already past are skipped."""
    for entry in recorded:
        until = entry.until - wall_now + mono_now
        if until > mono_now:
            blacklist.restore(entry.key, until, entry.strikes)
            logger.info("%s stays blacklisted for %.0f s", entry.key, until - mono_now)


def resume_job(
    driver: ElasticDriver,
    record: JobRecordData,
    slots_per_worker: int,
    *,
    wall_now: float,
    mono_now: float,
) -> RecordedRound | None:
    """When a job's driver starts again, give it what the job's ``record`` holds: the counts
    of resets and restarts (so ``resetLimit`` and ``maxRestarts`` count those before), the
    committed step (a durable fallback counts its lost steps from it), the lost time (so
    goodput covers the whole job, its time suspended left out), the blacklisting in force
    until its recorded ends (into the driver's blacklist), and the round in force, so its
    workers train on undisturbed; return that round (None: none to adopt). ``wall_now`` and
    ``mono_now`` are the same moment on the wall clock and on the driver's."""
    state = record.state
    driver.resume_resets(state.resets, state.restarts, state.last_reset_reason)
    restore_blacklist(driver.hosts.blacklist, state.blacklist, wall_now, mono_now)
    recorded = recorded_round(state, slots_per_worker)
    if recorded is not None:
        driver.adopt(recorded.round, recorded.slots, recorded.notice_seq)
    running_for = state.running_seconds
    if state.suspended_since is None:  # it ran on since the record was written
        running_for += max(wall_now - record.written_at, 0.0)
    driver.resume_account(state.committed_step, state.lost_seconds, running_for)
    return recorded


def resumption_message(state: JobState, job_id: str, *, checkpoints: bool) -> str:
    """What the event of a suspended job that resumes says (``state``: as its record held it
    when it was suspended; ``checkpoints``: its first round loads the newest checkpoint)."""
    if not state.last_round:
        return f"job {job_id} started (it was suspended before it trained)"
    if checkpoints:
        return f"job {job_id} resumed from its newest checkpoint"
    lost = state.committed_step
    steps = "" if lost is None else f" ({lost} committed steps lost)"
    return f"job {job_id} resumed without a checkpoint: training starts afresh{steps}"
