"""A job's record: a bounded time series of what happened to it, for the timeline picture.

The driver appends to it as things happen: rounds formed (with their world size), failures,
blacklisted hosts, progress samples (world size and samples/s), and the goodput account; the
operator adds scale requests. It is kept in the cluster by the operator (so it outlives
operator restarts) and written to a file by the local launcher (``--job-record``);
``elasticjob timeline`` draws it (``elasticjob/job_timeline.py``). It also holds the job's
durable state (``job_state.py``), which the next driver of the job resumes from.

Bounds: at most :data:`MAX_EVENTS` events (the oldest dropped first, but the first one, the
job's start, kept) and :data:`MAX_SAMPLES` samples; when the samples are full, every other
one is dropped, so the series always spans the whole job at a resolution that halves as it
grows. A full record stays well under 300 kB of JSON.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field

from elasticjob.driver.job_state import JobState

MAX_EVENTS: Final = 400
MAX_SAMPLES: Final = 1200
MIN_SAMPLE_INTERVAL_S: Final = 1.0
"""Samples closer together than this replace the previous one (unless the world changed)."""

_Finite = Annotated[float, Field(allow_inf_nan=False)]


class EventKind(enum.StrEnum):
    """What a job record event marks."""

    STARTED = "started"
    ROUND = "round"
    RESUMED = "resumed"
    """Training (re)started in a round: the end of a startup, recovery or resize pause."""
    RESIZED = "resized"
    """A round ended at the barrier for hosts added or removed."""
    FAILURE = "failure"
    BLACKLISTED = "blacklisted"
    SCALE = "scale"
    CHECKPOINT = "checkpoint"
    """Rank 0 wrote a durable checkpoint."""
    RESTORED = "restored"
    """No worker survived: the new round's rank 0 loaded a durable checkpoint."""
    ADOPTED = "adopted"
    """An operator took the running round over: it restarted, or another replica came to
    lead (the job's workers trained on)."""
    STRAGGLER = "straggler"
    """A member was flagged as a straggler (consistently slower steps than the others)."""
    HEALTH_CHECK_FAILED = "health-check-failed"
    """A new pod failed its health check: it was not admitted, its node was blacklisted."""
    HEALTH_CHECK_PASSED = "health-check-passed"
    """A new pod passed its health check."""
    WORKER_FAILED = "worker-failed"
    """The front end saw a worker fail, and why (a pod's phase, an exit code, a lost node)."""
    LEAVING = "leaving"
    """A worker was chosen to leave the job (a scale-in); it leaves with its state."""
    CLAMPED = "clamped"
    """The job's requested size is out of its bounds; the job runs at the nearest bound."""
    CREATE_REFUSED = "create-refused"
    """The API server refused to create the job's pods for now (an exceeded quota): the
    controller tries again at its next passes."""
    SUSPENDED = "suspended"
    """The job was suspended: its run ended with its state saved, until it is resumed."""
    FINISHED = "finished"


class RecordChange(enum.IntEnum):
    """What changed in a record since it was saved, in order of weight: a change of the
    job's state outweighs an event, which outweighs samples (false: nothing)."""

    NONE = 0
    SAMPLES = 1
    """Only progress samples were added."""
    EVENTS = 2
    """An event was added (perhaps samples too)."""
    STATE = 3
    """What a new driver resumes from changed (``job_state.py``): a round was published or
    failed, a notice posted, a host blacklisted, the run ended or was taken over."""


STATE_EVENTS: Final = frozenset(
    {
        EventKind.ROUND,
        EventKind.FAILURE,
        EventKind.BLACKLISTED,
        EventKind.ADOPTED,
        EventKind.SUSPENDED,
        EventKind.FINISHED,
    }
)
"""The kinds of event that come with a change of the job's state."""


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RecordEvent(_Record):
    """One event: its wall time (seconds since the epoch), kind and what it says."""

    t: _Finite
    kind: EventKind
    message: str = ""
    round: Annotated[int, Field(ge=0)] = 0
    world_size: Annotated[int, Field(ge=0)] = 0
    rolled_back_from: _Finite | None = None
    """On a ``RESUMED`` event after a failure, when the training that the failure threw away
    began (the last commit before it, or the checkpoint a durable fallback loaded): the work
    trained from then to the failure is trained again in this round."""
    until: _Finite | None = None
    """On a ``BLACKLISTED`` event, when the host's cooldown ends."""
    host: str = ""
    """The host, node or pod the event concerns, if one."""
    warning: bool = False
    """The event is bad news for the job (a failure, lost work, a slow or unhealthy host)."""


class RecordSample(_Record):
    """The job's world size and throughput at wall time ``t``."""

    t: _Finite
    world_size: Annotated[int, Field(ge=0)]
    samples_per_second: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0


class JobRecordData(_Record):
    """A job record as it is stored (JSON)."""

    job: str
    events: tuple[RecordEvent, ...] = ()
    samples: tuple[RecordSample, ...] = ()
    state: JobState = JobState()
    """What the next driver of the job resumes from (its lost time, for the timeline)."""
    goodput: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] = 1.0
    written_at: _Finite = 0.0


class JobRecord:
    """The record of one job, appended to as things happen (see the module docstring)."""

    def __init__(
        self,
        job: str,
        wall_clock: Callable[[], float],
        on_change: Callable[[RecordChange, RecordEvent | None], None] | None = None,
    ) -> None:
        """``on_change`` is told what changed after every addition, and the event added if
        one was (the journal passes both on to its subscribers: whoever saves the record,
        whoever tells the job's events)."""
        self.job = job
        self._wall_clock = wall_clock
        self._on_change = on_change
        self._events: list[RecordEvent] = []
        self._samples: list[RecordSample] = []
        self._changed = RecordChange.NONE

    @classmethod
    def resumed(
        cls,
        data: JobRecordData,
        wall_clock: Callable[[], float],
        on_change: Callable[[RecordChange, RecordEvent | None], None] | None = None,
    ) -> JobRecord:
        """Carry on a stored record (an operator restarted)."""
        record = cls(data.job, wall_clock, on_change)
        record._events = list(data.events)
        record._samples = list(data.samples)
        return record

    @property
    def events(self) -> tuple[RecordEvent, ...]:
        """The events recorded so far, oldest first."""
        return tuple(self._events)

    @property
    def changed(self) -> RecordChange:
        """What was added since the record was last :meth:`saved` (false: nothing)."""
        return self._changed

    def saved(self) -> None:
        """The record as it is now has been stored."""
        self._changed = RecordChange.NONE

    def event(
        self,
        kind: EventKind,
        message: str = "",
        *,
        round: int = 0,
        world_size: int = 0,
        rolled_back_s: float | None = None,
        for_s: float | None = None,
        host: str = "",
        warning: bool = False,
    ) -> None:
        """Record that ``kind`` happened now (to ``host``; ``warning``: as bad news);
        ``rolled_back_s``: how long ago the training that a failure threw away began (see
        :attr:`RecordEvent.rolled_back_from`); ``for_s``: how long a blacklisting lasts (see
        :attr:`RecordEvent.until`)."""
        now = self._wall_clock()
        event = RecordEvent(
            t=now,
            kind=kind,
            message=message,
            round=round,
            world_size=world_size,
            rolled_back_from=None if rolled_back_s is None else now - rolled_back_s,
            until=None if for_s is None else now + for_s,
            host=host,
            warning=warning,
        )
        self._events.append(event)
        if len(self._events) > MAX_EVENTS:
            del self._events[1]
        self._note(RecordChange.STATE if kind in STATE_EVENTS else RecordChange.EVENTS, event)

    def state_changed(self) -> None:
        """The job's state changed with no event of the story (a notice was posted)."""
        self._note(RecordChange.STATE)

    def sample(self, world_size: int, samples_per_second: float) -> None:
        """Record the world size and throughput now."""
        now = self._wall_clock()
        sample = RecordSample(
            t=now, world_size=world_size, samples_per_second=max(samples_per_second, 0.0)
        )
        last = self._samples[-1] if self._samples else None
        if (
            last is not None
            and now - last.t < MIN_SAMPLE_INTERVAL_S
            and last.world_size == world_size
            and len(self._samples) > 1
        ):
            self._samples[-1] = sample
        else:
            self._samples.append(sample)
        if len(self._samples) > MAX_SAMPLES:
            self._samples = self._samples[::2] + ([sample] if len(self._samples) % 2 == 0 else [])
        self._note(RecordChange.SAMPLES)

    def _note(self, change: RecordChange, event: RecordEvent | None = None) -> None:
        self._changed = max(self._changed, change)
        if self._on_change is not None:
            self._on_change(self._changed, event)

    def data(self, state: JobState, goodput: float) -> JobRecordData:
        """The record as stored, with the job's ``state`` and goodput at this moment."""
        return JobRecordData(
            job=self.job,
            events=tuple(self._events),
            samples=tuple(self._samples),
            state=state,
            goodput=round(min(max(goodput, 0.0), 1.0), 4),
            written_at=self._wall_clock(),
        )
