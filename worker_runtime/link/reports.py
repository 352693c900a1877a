"""What a worker tells the driver besides asking for rounds: how its process ends (its
result) and, on rank 0, the training's progress, commits, checkpoints and resumptions (sent
by ``progress.py``'s thread, so the training loop never waits on the rendezvous service).

Every report is best effort: a service that cannot be reached loses it, never the training.
A script run without a launcher reports nothing (:class:`NoReports`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Final, Protocol

from elasticjob.wire.messages import (
    CheckpointReport,
    ProgressRequest,
    ResultRequest,
    ScriptExit,
    WorkerState,
)
from elasticjob.worker_runtime.diagnostics.log import get_logger
from elasticjob.worker_runtime.link.progress import ProgressReporter
from elasticjob.worker_runtime.link.rendezvous_client import RendezvousClient, RendezvousClientError

logger = get_logger(__name__)

LEAVING_REPORT_S: Final = 10.0
"""How long the report of a process leaving at interpreter exit is retried: a service that
cannot be reached must not hold the exit back for the client's whole retry deadline."""

RESULT_MESSAGE_CHARS: Final = 4000
"""The end of a failure's message that is sent (its last lines: the error)."""
RAISED_EXIT_CODE: Final = 1
"""The exit status a failure reports for a script that raised (the interpreter's)."""


def script_failure(message: str) -> ScriptExit:
    """How a script that raised failed, for its ``FAILURE`` result: the interpreter's exit
    status and the end of ``message``."""
    return ScriptExit(exit_code=RAISED_EXIT_CODE, log_tail=message[-RESULT_MESSAGE_CHARS:])


Position = Callable[[], tuple[int, int, int]]
"""The worker's round, rank and step now."""


class Reports(Protocol):
    """What a worker tells the driver (see the module docstring)."""

    end_delivered: bool
    """Whether the driver has this process's result (a report of it arrived)."""

    def stop(self) -> None:
        """Stop sending progress (what was offered and not sent yet is dropped)."""

    def result(
        self,
        state: WorkerState,
        script_exit: ScriptExit | None = None,
        *,
        retry_for_s: float | None = None,
    ) -> None:
        """Tell the driver how this worker's process ends, with how its script failed for a
        ``FAILURE`` (best effort, retried for
        ``retry_for_s``; default: the client's retry deadline); :attr:`end_delivered` says
        whether a report arrived."""

    def exit_status(self) -> None:
        """At interpreter exit, the process's end as the interpreter knows it: an uncaught
        exception (``sys.last_value``) is a failure, anything else a success (the exit status
        decides either way)."""

    def progress(self, epoch: int, step: int, samples_per_second: float) -> None:
        """Rank 0 reports training progress for the job's status (others do nothing)."""

    def resumed(self, restored_from: CheckpointReport | None = None) -> None:
        """Training starts or resumes in this round now (rank 0 tells the driver at once:
        the end of a recovery or a resize), from ``restored_from`` if rank 0 loaded it."""

    def checkpoint(self, report: CheckpointReport) -> None:
        """Rank 0 completed a durable checkpoint (any thread)."""

    def commit(self, seconds: float) -> None:
        """A commit took ``seconds`` (rank 0's are reported, for the job's metrics)."""

    def flush(self, timeout_s: float) -> bool:
        """Send the progress not sent yet now and wait for it, up to ``timeout_s`` (before
        the process leaves the job: its last commit and checkpoint must reach the driver);
        return whether it was sent."""


class NoReports(Reports):
    """The reports of a process that no driver hears: nothing is sent."""

    end_delivered = False

    def stop(self) -> None:
        pass

    def result(
        self,
        state: WorkerState,
        script_exit: ScriptExit | None = None,
        *,
        retry_for_s: float | None = None,
    ) -> None:
        pass

    def exit_status(self) -> None:
        pass

    def progress(self, epoch: int, step: int, samples_per_second: float) -> None:
        pass

    def resumed(self, restored_from: CheckpointReport | None = None) -> None:
        pass

    def checkpoint(self, report: CheckpointReport) -> None:
        pass

    def commit(self, seconds: float) -> None:
        pass

    def flush(self, timeout_s: float) -> bool:
        return True


class DriverReports(Reports):
    """The reports of worker ``hostname[local_rank]`` through ``client``; ``position`` tells
    where the worker is when a report is made."""

    def __init__(
        self, client: RendezvousClient, hostname: str, local_rank: int, position: Position
    ) -> None:
        self._client = client
        self._hostname = hostname
        self._local_rank = local_rank
        self._position = position
        self._progress = ProgressReporter(client.report_progress)
        self._last_progress: tuple[int, float] = (0, 0.0)
        self.end_delivered = False

    def stop(self) -> None:
        self._progress.stop()

    def result(
        self,
        state: WorkerState,
        script_exit: ScriptExit | None = None,
        *,
        retry_for_s: float | None = None,
    ) -> None:
        try:
            self._client.report_result(
                ResultRequest(
                    hostname=self._hostname,
                    local_rank=self._local_rank,
                    state=state,
                    script_exit=script_exit,
                ),
                retry_for_s=retry_for_s,
            )
        except RendezvousClientError as exc:
            logger.warning("could not report %s: %s", state.value, exc)
        else:
            self.end_delivered = True

    def exit_status(self) -> None:
        error = getattr(sys, "last_value", None)
        if error is None:
            self.result(WorkerState.SUCCESS, retry_for_s=LEAVING_REPORT_S)
        else:
            self.result(
                WorkerState.FAILURE,
                script_failure(f"{type(error).__name__}: {error}"),
                retry_for_s=LEAVING_REPORT_S,
            )

    def progress(self, epoch: int, step: int, samples_per_second: float) -> None:
        self._last_progress = (epoch, max(samples_per_second, 0.0))
        self._offer(step=step)

    def resumed(self, restored_from: CheckpointReport | None = None) -> None:
        self._offer(resumed=True, restored_from=restored_from, committed=True)

    def checkpoint(self, report: CheckpointReport) -> None:
        self._offer(checkpoints=(report,))

    def commit(self, seconds: float) -> None:
        self._offer(commit_seconds=(max(seconds, 0.0),), committed=True)

    def flush(self, timeout_s: float) -> bool:
        return self._progress.flush(timeout_s)

    def _offer(
        self,
        *,
        step: int | None = None,
        resumed: bool = False,
        commit_seconds: tuple[float, ...] = (),
        checkpoints: tuple[CheckpointReport, ...] = (),
        restored_from: CheckpointReport | None = None,
        committed: bool = False,
    ) -> None:
        """Hand rank 0's report to the progress thread: at ``step`` (None: the worker's step
        now), which is the committed step when ``committed``."""
        round_number, rank, now_at = self._position()
        if rank != 0:
            return
        step = now_at if step is None else step
        epoch, samples_per_second = self._last_progress
        self._progress.offer(
            ProgressRequest(
                round=round_number,
                epoch=epoch,
                step=step,
                samples_per_second=samples_per_second,
                resumed=resumed,
                commit_seconds=commit_seconds,
                checkpoints=checkpoints,
                restored_from=restored_from,
                committed_step=step if committed else None,
            ),
            urgent=resumed,
        )
