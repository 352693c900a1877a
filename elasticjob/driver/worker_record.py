"""What the driver knows about one worker process it launched (:class:`WorkerRecord`)."""

from __future__ import annotations

from dataclasses import dataclass

from elasticjob.driver.driver_types import Departure
from elasticjob.driver.partition import ReceivedReport
from elasticjob.wire.messages import HeldShards, StepPace, WorkerId

_EXIT_CAUSES = {126: " (command not executable)", 127: " (command not found)"}
"""What a shell's exit status says about the command it could not run."""

NOT_JOINED_HINT = (
    "a worker joins the job through elasticjob.worker_runtime: init(), and elastic.run when "
    "added to a running job; a torchrun script runs unchanged in restart mode "
    "(elasticjob-run --mode restart, spec.mode: restart), or joins with the changes of the "
    "torchrun / DDP recipe in docs/worker-runtime.md"
)
"""Said of a worker whose process ended before it ever asked for a round."""


def ended_without_joining(worker: WorkerId) -> str:
    """Why the job fails when ``worker`` exited 0 without ever asking for a round."""
    return (
        f"worker {worker} exited with status 0 before it joined the job: its command never "
        f"asked for a round, and a fresh process would do the same ({NOT_JOINED_HINT})"
    )


@dataclass
class WorkerRecord:
    """What the driver knows about one worker process it launched."""

    started_at: float
    running: bool = True
    waiting_after: int | None = None
    """The newest round after which the worker asked for the next one (None: it has not
    registered yet)."""
    last_round: int = 0
    """The last round it was a member of (0: none yet, a newcomer)."""
    departure: Departure | None = None
    dismissed_at: float | None = None
    stop_requested: bool = False
    message: str = ""
    """The last lines the worker reported with its result."""
    last_heartbeat: float | None = None
    """When its process last beat (None: not yet, or it is being killed)."""
    ending_since: float | None = None
    """When it reported how its process ends (None: it has not): its exit is awaited from
    then on, not its heartbeat."""
    probe_report: ReceivedReport | None = None
    """What it found probing its peers, with its latest heartbeat (None: that beat had no
    report: none of its collectives blocked)."""

    saved_for_suspension: bool = False
    """Its latest request for a round said it saved its state for a suspension."""
    exit_seen: int | None = None
    """The exit code its pod's slot supervisor saw its process end with (None: none seen):
    the driver kills it through its launcher, which reports its end as usual."""
    held_shards: HeldShards | None = None
    """What its latest request for a round or heartbeat said it holds of a sharded state
    (None: nothing)."""
    pace: StepPace | None = None
    """How busy its recent steps kept it, from its latest heartbeat (None: not reported)."""
    heard_from: bool = False
    """Its process's runtime beat or reported how it ends: it called ``init()``."""

    @property
    def ending(self) -> bool:
        """Whether it reported how its process ends."""
        return self.ending_since is not None

    @property
    def registered(self) -> bool:
        """Whether the process runs the worker runtime: it asked for a round, was a member of
        one, or its runtime was heard from (a newcomer of a script without ``elastic.run``
        calls ``init()`` and never asks; a command that never calls ``init()`` has none of
        these)."""
        return self.waiting_after is not None or self.last_round > 0 or self.heard_from

    def fail_outside_round(self, exit_code: int) -> None:
        """Its process failed while it was no member of a running round (before it joined
        one, or while the next one formed): it counts as failed, and says how it ended."""
        self.departure = Departure.FAILED
        cause = _EXIT_CAUSES.get(exit_code, "")
        if self.registered:
            where = "outside a round"
        elif cause:
            where = "before it joined the job"
        else:
            where = f"before it joined the job ({NOT_JOINED_HINT})"
        self.message = self.message or f"exited with status {exit_code}{cause} {where}"

    @property
    def at_barrier(self) -> bool:
        """Whether the process runs and waits for a round after the last one it was in. A
        dismissed process never is: it was told to exit and does (when its host comes back,
        a fresh process takes the slot)."""
        waiting_after = self.waiting_after
        return (
            self.running
            and self.departure is not Departure.DISMISSED
            and waiting_after is not None
            and waiting_after >= self.last_round
        )
