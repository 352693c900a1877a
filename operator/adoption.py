"""Taking a job over after an operator restart, from what its status recorded: the round in
force (so its workers train on undisturbed) and the blacklisted nodes (so they stay out until
their recorded end); and which objects are the job's at all (:func:`ownership`): only those
the job controls by ownerReference, never an object that merely carries its labels or name.
Pure functions of the status, the objects and the clocks, and :func:`resume_job`, which hands
what the status recorded to a new driver."""

from __future__ import annotations

import datetime
import enum
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from elasticjob.driver.blacklist import Blacklist
from elasticjob.driver.driver import ElasticDriver
from elasticjob.driver.goodput import LostTo
from elasticjob.driver.slot_assignment import assign_slots
from elasticjob.operator.api import (
    KIND,
    BlacklistedNode,
    ConditionType,
    ElasticJobStatus,
    LostSeconds,
    Phase,
)
from elasticjob.wire.messages import SlotInfo, WorkerId

logger = logging.getLogger(__name__)


class Ownership(enum.Enum):
    """Whose an object (a worker pod, the token Secret) is, as far as a job can tell."""

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
    """The round a job's status records, as the driver adopts it."""

    round: int
    slots: Mapping[WorkerId, SlotInfo]
    notice_seq: int
    rank_order: tuple[str, ...]
    """Its pods by rank."""


def running_round(status: ElasticJobStatus) -> bool:
    """Whether ``status`` records a round whose workers may be training (to take over, or to
    suspend with their state saved)."""
    return status.phase is not Phase.SUSPENDED and bool(status.round and status.workers)


def suspended_seconds(status: ElasticJobStatus, wall_now: float) -> float:
    """The wall time the job of ``status`` has spent suspended up to ``wall_now``: what its
    goodput recorded, and the suspension under way (since its Suspended condition turned
    True), if any."""
    total = status.goodput.suspended_seconds if status.goodput is not None else 0.0
    if status.phase is Phase.SUSPENDED:
        since = [c for c in status.conditions if c.type is ConditionType.SUSPENDED]
        if since:
            total += max(wall_now - since[0].last_transition_time.timestamp(), 0.0)
    return total


def recorded_round(status: ElasticJobStatus, slots_per_worker: int) -> RecordedRound | None:
    """The round ``status`` records, or None when there is none or it does not fit the
    pods' slots (then a new round is formed)."""
    if not status.round or not status.workers:
        return None
    order = sorted(status.workers, key=lambda w: min(w.ranks or [0]))
    slots = assign_slots([(w.pod, slots_per_worker) for w in order], min_np=1, max_np=None)
    recorded = {(w.pod, rank) for w in status.workers for rank in w.ranks}
    if {(worker.hostname, slot.rank) for worker, slot in slots.items()} != recorded:
        logger.warning("the recorded round %d does not fit its pods; not adopted", status.round)
        return None
    return RecordedRound(status.round, slots, status.notice_seq, tuple(w.pod for w in order))


def restore_blacklist(
    blacklist: Blacklist[str], recorded: list[BlacklistedNode], wall_now: float, mono_now: float
) -> None:
    """Blacklist the ``recorded`` nodes again until their recorded (wall-clock) ends, on the
    blacklist's monotonic clock (``mono_now`` read from it at ``wall_now``), with their
    strikes. Ends already past are skipped."""
    for entry in recorded:
        until = entry.until.timestamp() - wall_now + mono_now
        if until > mono_now:
            blacklist.restore(entry.node, until, entry.strikes)
            logger.info("node %s stays blacklisted until %s", entry.node, entry.until)


def blacklisted_nodes(
    blacklist: Blacklist[str], wall_now: float, mono_now: float
) -> list[BlacklistedNode]:
    """The active blacklisting as the status records it: wall-clock ends (whole seconds,
    rounded up so a restored end never comes early) and strikes."""
    offset = wall_now - mono_now
    return [
        BlacklistedNode(
            node=node,
            until=datetime.datetime.fromtimestamp(math.ceil(until + offset), datetime.UTC),
            strikes=max(1, blacklist.strikes(node)),
        )
        for node, until in sorted(blacklist.active().items())
    ]


def resume_job(
    driver: ElasticDriver,
    status: ElasticJobStatus,
    slots_per_worker: int,
    *,
    wall_now: float,
    mono_now: float,
    node_blacklist: Blacklist[str] | None,
) -> RecordedRound | None:
    """After an operator restart, give ``driver`` what ``status`` recorded: the counts of
    resets and restarts (so ``resetLimit`` and ``maxRestarts`` count those before the
    restart), the committed step (a durable
    fallback counts its lost steps from it), the lost time (so goodput covers the whole job,
    its time suspended left out),
    the blacklisted nodes until their recorded ends (into ``node_blacklist``, with scope
    Node), and the round in force, so its workers train on undisturbed; return that round
    (None: none to adopt). ``wall_now`` and ``mono_now`` are the same moment on the wall
    clock and on the driver's."""
    driver.resume_resets(status.reset_count, status.restart_count, status.last_reset_reason)
    if node_blacklist is not None:
        restore_blacklist(node_blacklist, status.blacklisted_nodes, wall_now, mono_now)
    recorded = recorded_round(status, slots_per_worker)
    if recorded is not None:
        driver.adopt(recorded.round, recorded.slots, recorded.notice_seq)
    running_for = None
    if status.start_time is not None:
        running_for = wall_now - status.start_time.timestamp() - suspended_seconds(status, wall_now)
    lost = status.goodput.lost_seconds if status.goodput else LostSeconds()
    driver.resume_account(
        status.progress.committed_step if status.progress else None,
        {cause: getattr(lost, cause.value) for cause in LostTo},
        running_for,
    )
    return recorded


def resumption_message(status: ElasticJobStatus, job_id: str, *, checkpoints: bool) -> str:
    """What the event of a suspended job that resumes says (``status``: as recorded when it
    was suspended; ``checkpoints``: its first round loads the newest checkpoint)."""
    if not status.round:
        return f"job {job_id} started (it was suspended before it trained)"
    if checkpoints:
        return f"job {job_id} resumed from its newest checkpoint"
    lost = status.progress.committed_step if status.progress else None
    steps = "" if lost is None else f" ({lost} committed steps lost)"
    return f"job {job_id} resumed without a checkpoint: training starts afresh{steps}"
