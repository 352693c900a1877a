"""What happened to a job, as the driver tells it: one place that turns the driver's events
into the goodput account (``goodput.py``), the job's record (``job_record.py``), the
durations its observer wants (the operator's histograms) and its durable checkpoints (the
last one written, the one a fallback loaded and the steps it lost).

The driver calls one method per event; :class:`JobJournal` decides what each means for the
three, and pushes what its subscribers follow (:data:`JournalEvent`: a round published, a
checkpoint restored, a host blacklisted, the record changed) to them: the operator turns the
first three into Kubernetes events, and whoever keeps the record saves it
(``record_saving.py``). Times are the driver's clock (monotonic seconds); the record stamps
wall time itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Final

from elasticjob.driver.driver_types import DriverObserver, Unobserved
from elasticjob.driver.goodput import (
    LostTime,
    LostTo,
    on_commit,
    on_failure,
    on_first_step,
    on_resize,
    on_restored,
)
from elasticjob.driver.job_record import (
    EventKind,
    JobRecord,
    JobRecordData,
    RecordChange,
    RecordEvent,
)
from elasticjob.driver.job_state import JobState
from elasticjob.driver.journal_events import (
    HealthChecked,
    JournalEvent,
    JournalListener,
    RecordChanged,
    Recorded,
    Restore,
)
from elasticjob.wire.messages import CheckpointReport, ProgressRequest

_CHECKPOINT_TIMES_KEPT: Final = 64
"""How many checkpoints' commit times the journal remembers (for the goodput of a restore)."""


class JobJournal:
    """The goodput account, the record and the observer of one job."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._listeners: list[JournalListener] = []
        self.observer: DriverObserver = Unobserved()
        self.wall_clock: Callable[[], float] = time.time
        self.record = JobRecord("job", self.wall_clock, self._record_changed)
        """Front ends start it with a name (:meth:`start_record`) or carry a stored one on
        (:meth:`resume_record`)."""
        self.suspended_seconds = 0.0
        """Wall time the job spent suspended before this run."""
        self.suspended_since: float | None = None
        """When this run ended suspended (wall time; None: it did not)."""
        self.lost_time = LostTime.start(clock())
        self._paused_in_round = 0
        """The round in which training last stopped (0: the job has not trained yet)."""
        self._round_ended_at: float | None = clock()
        """When the round in force ended or failed (the job's start, before round 1)."""
        self.committed_step: int | None = None
        """The runtime's step count at rank 0's newest commit (front ends carry a stored
        one on)."""
        self.last_checkpoint: CheckpointReport | None = None
        """The newest durable checkpoint rank 0 reported written."""
        self.restore: Restore | None = None
        """The latest durable fallback, once training resumed from a checkpoint."""
        self._checkpoint_times: dict[str, float] = {}
        self._resuming = False
        """The job resumes after a suspension: the first restore is its resumption."""
        self.stragglers_found = 0
        """Members flagged as stragglers so far (by this driver)."""
        self._failure_told = 0
        """The newest round whose failure the record tells."""
        self._unexplained: tuple[int, int, str] | None = None
        """A round that rolled back before any member was seen to fail: (round, world size,
        the host of the first member that reported it)."""
        """When the state each recent checkpoint holds was committed (the driver's clock)."""

    def subscribe(self, listener: JournalListener) -> None:
        """Push every later :data:`JournalEvent` to ``listener``."""
        self._listeners.append(listener)

    def _tell(self, event: JournalEvent) -> None:
        for listener in self._listeners:
            listener(event)

    def _record_changed(self, change: RecordChange, event: RecordEvent | None) -> None:
        if event is not None:
            self._tell(Recorded(event))
        self._tell(RecordChanged(change))

    def start_record(self, job: str, wall_clock: Callable[[], float], started: str) -> None:
        """Start the record of ``job``, its first event saying how it ``started``."""
        self.wall_clock = wall_clock
        self.record = JobRecord(job, wall_clock, self._record_changed)
        self.record.event(EventKind.STARTED, started)

    def resume_record(self, data: JobRecordData, wall_clock: Callable[[], float]) -> None:
        """Carry on a stored record (the operator restarted, or the suspended job resumes:
        its suspension ends now)."""
        self.wall_clock = wall_clock
        self.record = JobRecord.resumed(data, wall_clock, self._record_changed)
        self.suspended_seconds = data.state.suspended_for(wall_clock())

    def state_changed(self) -> None:
        """What a new driver resumes from changed with no event of the job's story (a
        notice was posted): the record is saved at once."""
        self.record.state_changed()

    def scaled(self, old: int, new: int, round_number: int, world_size: int) -> None:
        """Someone asked for ``new`` worker pods instead of ``old``."""
        self.record.event(
            EventKind.SCALE, f"replicas {old} -> {new}", round=round_number, world_size=world_size
        )

    def record_data(self, state: JobState) -> JobRecordData:
        """The record as stored: its events and samples, the job's ``state`` now (built by
        ``job_state.job_state``) and the goodput now."""
        return self.record.data(state, self.lost_time.goodput(self._clock()))

    def adopted(self, round_number: int, world_size: int) -> None:
        """A new driver (its operator restarted, or another replica came to lead) took over
        ``round_number``, which is training."""
        self._paused_in_round, self._round_ended_at = round_number, None
        self.lost_time = LostTime.training(self._clock())
        self.record.event(
            EventKind.ADOPTED,
            "an operator took the running round over",
            round=round_number,
            world_size=world_size,
        )

    def running_seconds(self) -> float:
        """How long the job has run (its time suspended left out, earlier runs included)."""
        return max(self._clock() - self.lost_time.started_at, 0.0)

    def resume_lost_time(self, lost: Mapping[LostTo, float], running_for_s: float) -> None:
        """Carry on the account of a job that had run ``running_for_s`` and lost ``lost``."""
        self.lost_time = self.lost_time.resumed(lost, running_for_s)

    def progress(self, progress: ProgressRequest, current_round: int, world_size: int) -> None:
        """Rank 0 reported: a throughput sample, commit durations, and maybe the first step
        of a round after a pause (the end of a startup, recovery or resize)."""
        now = self._clock()
        self.record.sample(world_size, progress.samples_per_second)
        for seconds in progress.commit_seconds:
            self.observer.committed(seconds)
        for checkpoint in progress.checkpoints:
            self._checkpointed(checkpoint, progress.round, world_size, now)
        restored = progress.restored_from
        if restored is not None and (self.restore is None or self.restore.round < progress.round):
            self._restored(restored, progress.round, world_size)
        if progress.committed_step is not None:
            self.committed_step = progress.committed_step
        if self._paused_in_round < progress.round == current_round:
            paused = self.lost_time.paused_since is not None
            rolled_back_s = self._rolled_back_s(now)
            self.lost_time, recovery = on_first_step(self.lost_time, now)
            if recovery is not None:
                self.observer.recovered(recovery)
            if paused:
                self.record.event(
                    EventKind.RESUMED,
                    "" if recovery is None else f"recovered in {recovery:.2f} s",
                    round=progress.round,
                    world_size=world_size,
                    rolled_back_s=rolled_back_s,
                )
        if progress.commit_seconds:
            self.lost_time = on_commit(self.lost_time, now)

    def _rolled_back_s(self, now: float) -> float | None:
        """While recovering, how long before ``now`` the training that the failure threw away
        began (None: it threw none away)."""
        lost = self.lost_time
        if (
            lost.paused_for is not LostTo.RECOVERY
            or lost.paused_since is None
            or lost.rollback_from is None
            or lost.rollback_from >= lost.paused_since
        ):
            return None
        return now - lost.rollback_from

    def _checkpointed(
        self, checkpoint: CheckpointReport, round_number: int, world_size: int, now: float
    ) -> None:
        self.observer.checkpointed(checkpoint.seconds)
        self.last_checkpoint = checkpoint
        self.committed_step = max(self.committed_step or 0, checkpoint.step)
        # Written off the training thread: the state it holds was committed about as long
        # before the report as the write took.
        self._checkpoint_times[checkpoint.name] = now - checkpoint.seconds
        while len(self._checkpoint_times) > _CHECKPOINT_TIMES_KEPT:
            del self._checkpoint_times[next(iter(self._checkpoint_times))]
        self.record.event(
            EventKind.CHECKPOINT,
            f"{checkpoint.name} at step {checkpoint.step} ({checkpoint.seconds:.1f} s)",
            round=round_number,
            world_size=world_size,
        )

    def _restored(self, checkpoint: CheckpointReport, round_number: int, world_size: int) -> None:
        last = self.committed_step
        # Unknown (rather than a made-up figure) when no commit was reported, or when the
        # commits reported are older than the checkpoint (reports lost with the workers).
        lost = None if last is None or last < checkpoint.step else last - checkpoint.step
        self.restore = Restore(checkpoint, round_number, lost, resumed=self._resuming)
        self._resuming = False
        self.lost_time = on_restored(self.lost_time, self._checkpoint_times.get(checkpoint.name))
        steps = "an unknown number of" if lost is None else str(lost)
        cause = "the job resumed after a suspension" if self.restore.resumed else "no survivor"
        self.record.event(
            EventKind.RESTORED,
            f"{checkpoint.name} at step {checkpoint.step}: {steps} committed steps trained "
            f"again ({cause})",
            round=round_number,
            world_size=world_size,
            warning=not self.restore.resumed or lost != 0,
        )

    def fell_back(self, round_number: int) -> None:
        """No worker of ``round_number`` survives: the next round starts from the newest
        checkpoint, and the pause under way is a recovery (its members may have left
        gracefully, yet the job lost their state)."""
        self._explain_failure()
        self.record.sample(0, 0.0)  # nobody trains until the fresh workers resume
        self._stop(round_number, failed=True)

    def collective_failed(self, reporter: str, round_number: int, world_size: int) -> None:
        """A member of the round on ``reporter`` rolled back: a collective of the round failed.
        Training stops now; the record names the worker that failed once its exit is seen
        (:meth:`failed`), or says the collective failed if none is seen before the round
        ends."""
        if self._failure_told < round_number and self._unexplained is None:
            self._unexplained = (round_number, world_size, reporter)
        self._stop(round_number, failed=True)

    def failed(
        self, host: str, round_number: int, world_size: int, *, leaving: bool = False
    ) -> None:
        """A member of the round on ``host`` failed (``leaving``: it was leaving, and ended
        before the round released it); the record tells the first per round."""
        if self._failure_told < round_number:
            message = (
                f"a leaving worker on {host} ended before its round released it"
                if leaving
                else f"a worker on {host} failed"
            )
            self._record_failure(message, round_number, world_size)
        self._stop(round_number, failed=True)

    def _explain_failure(self) -> None:
        """The round that rolled back ends with no member's failure seen: the record says a
        collective failed."""
        if self._unexplained is None:
            return
        round_number, world_size, reporter = self._unexplained
        self._record_failure(
            f"a collective failed (first reported by a worker on {reporter})",
            round_number,
            world_size,
        )

    def _record_failure(self, message: str, round_number: int, world_size: int) -> None:
        """The record's one FAILURE event of ``round_number``."""
        self._failure_told = max(self._failure_told, round_number)
        self._unexplained = None
        self.record.event(EventKind.FAILURE, message, round=round_number, world_size=world_size)

    def round_ended(self, round_number: int, world_size: int) -> None:
        """The round ended at the barrier (hosts added or removed, or after a failure)."""
        self._explain_failure()
        if self.lost_time.paused_since is None:
            self.record.event(
                EventKind.RESIZED,
                "hosts added or removed",
                round=round_number,
                world_size=world_size,
            )
        self._stop(round_number, failed=False)

    def _stop(self, round_number: int, *, failed: bool) -> None:
        now = self._clock()
        self.lost_time = (on_failure if failed else on_resize)(self.lost_time, now)
        self._paused_in_round = round_number
        if self._round_ended_at is None:
            self._round_ended_at = now

    def published(
        self,
        round_number: int,
        world_size: int,
        joined: int,
        left: int,
        samples_per_second: float,
    ) -> None:
        """The next round was published, with ``world_size`` workers."""
        self._explain_failure()
        if self._round_ended_at is not None:
            self.observer.round_formed(self._clock() - self._round_ended_at)
            self._round_ended_at = None
        self.record.event(
            EventKind.ROUND,
            f"{joined} joined, {left} left",
            round=round_number,
            world_size=world_size,
        )
        self.record.sample(world_size, samples_per_second)

    def blacklisted(self, host: str, seconds: float, round_number: int) -> None:
        """``host`` is excluded for ``seconds``."""
        self.record.event(
            EventKind.BLACKLISTED,
            f"{host} for {seconds:.0f} s",
            round=round_number,
            for_s=seconds,
            host=host,
            warning=True,
        )

    def straggler(self, host: str, rank: int, slowdown: float, round_number: int) -> None:
        """Rank ``rank`` on ``host`` was flagged as a straggler."""
        self.stragglers_found += 1
        self.record.event(
            EventKind.STRAGGLER,
            f"rank {rank} on {host}: its steps keep it busy {slowdown:.2f}x as long as the "
            "other workers'",
            round=round_number,
            host=host,
            warning=True,
        )

    def health_checked(self, checked: HealthChecked, round_number: int) -> None:
        """A new pod's health check ended (see :class:`HealthChecked`)."""
        if checked.seconds is not None:
            self.observer.health_checked(checked.seconds, passed=checked.passed)
        where = f"{checked.host} on node {checked.node}" if checked.node else checked.host
        took = "" if checked.seconds is None else f" in {checked.seconds:.1f} s"
        self.record.event(
            EventKind.HEALTH_CHECK_PASSED if checked.passed else EventKind.HEALTH_CHECK_FAILED,
            f"{where} {'passed' if checked.passed else 'failed'} its health check{took}: "
            f"{checked.reason}",
            round=round_number,
            host=checked.host,
            warning=not checked.passed,
        )

    def noted(self, kind: EventKind, message: str, *, host: str, warning: bool) -> None:
        """The front end learnt what ``kind`` says about ``host`` (a worker failed and why, a
        worker leaves, the job's size is clamped): the record tells it."""
        self.record.event(kind, message, host=host, warning=warning)

    def resuming(self) -> None:
        """The job resumes after a suspension: the checkpoint its first round loads is its
        resumption, not a fallback."""
        self._resuming = True

    def suspended(self, message: str, round_number: int) -> None:
        """The job's run ended suspended (``message`` says how it went)."""
        self._explain_failure()
        self.suspended_since = self.wall_clock()
        self.record.event(EventKind.SUSPENDED, message, round=round_number)
        self.record.sample(0, 0.0)  # nobody trains until the job resumes

    def finished(self, success: bool, message: str, round_number: int) -> None:
        """The job ended."""
        self._explain_failure()
        first_line = message.splitlines()[0] if message else ""
        outcome = "succeeded" if success else "failed"
        self.record.event(
            EventKind.FINISHED,
            f"{outcome}: {first_line}" if first_line else outcome,
            round=round_number,
        )
