"""What a job's journal (``journal.py``) pushes to its subscribers as it happens
(:data:`JournalEvent`: an event recorded, the record changed), the durable fallback it keeps
(:class:`Restore`), and how a new pod's health check ended (:class:`HealthChecked`, which the
front end tells the driver)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from elasticjob.driver.job_record import RecordChange, RecordEvent
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
class Recorded:
    """``event`` was added to the job's record: what happened, as the job's story, status
    history and Kubernetes events tell it (``operator/job_story.py``)."""

    event: RecordEvent


@dataclass(frozen=True)
class RecordChanged:
    """The record has ``change`` (the heaviest kind of addition) since it was last saved."""

    change: RecordChange


@dataclass(frozen=True)
class HealthChecked:
    """The new pod ``host`` (on ``node``) passed its health check or not, in ``seconds``
    (None: it never reported), for ``reason``."""

    host: str
    node: str | None
    passed: bool
    reason: str
    seconds: float | None


JournalEvent = Recorded | RecordChanged
"""What the journal pushes to its subscribers."""

JournalListener = Callable[[JournalEvent], None]
"""A subscriber: called on the event loop, as the event happens; must not block."""
