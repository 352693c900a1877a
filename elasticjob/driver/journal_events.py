"""What a job's journal (``journal.py``) pushes to its subscribers as it happens
(:data:`JournalEvent`), and the durable fallback it keeps (:class:`Restore`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from elasticjob.driver.job_record import RecordChange
from elasticjob.wire.messages import CheckpointReport


@dataclass(frozen=True)
class Restore:
    """A durable fallback: no worker of the previous round survived (or the job resumed
    after a suspension), and rank 0 of ``round`` loaded ``checkpoint``."""

    checkpoint: CheckpointReport
    round: int
    steps_lost: int | None
    """Committed steps trained again: the last step rank 0 reported before the loss minus
    the checkpoint's (None: unknown, no step reported since the driver started, or the
    script reports step numbers of its own that come before the checkpoint's)."""
    resumed: bool = False
    """The job resumed after a suspension (its first round loaded the checkpoint)."""


@dataclass(frozen=True)
class RoundPublished:
    """Round ``round`` was published: ``world_size`` workers on ``hosts`` (sorted)."""

    round: int
    world_size: int
    hosts: tuple[str, ...]


@dataclass(frozen=True)
class CheckpointRestored:
    """Training resumed from a durable checkpoint (:class:`Restore`)."""

    restore: Restore


@dataclass(frozen=True)
class HostBlacklisted:
    """``host`` (a host, node or pod) is kept out for ``seconds`` from round ``round`` on."""

    host: str
    seconds: float
    round: int


@dataclass(frozen=True)
class RecordChanged:
    """The record has ``change`` (the heaviest kind of addition) since it was last saved."""

    change: RecordChange


@dataclass(frozen=True)
class StragglerFound:
    """Rank ``rank`` of round ``round``, on ``host``, is a straggler: its steps keep it busy
    ``slowdown`` times as long as the other members' (``stragglers.py``)."""

    host: str
    rank: int
    slowdown: float
    round: int


@dataclass(frozen=True)
class HealthChecked:
    """The new pod ``host`` (on ``node``) passed its health check or not, in ``seconds``
    (None: it never reported), for ``reason``."""

    host: str
    node: str | None
    passed: bool
    reason: str
    seconds: float | None


JournalEvent = (
    RoundPublished
    | CheckpointRestored
    | HostBlacklisted
    | StragglerFound
    | HealthChecked
    | RecordChanged
)
"""What the journal pushes to its subscribers."""

JournalListener = Callable[[JournalEvent], None]
"""A subscriber: called on the event loop, as the event happens; must not block."""
