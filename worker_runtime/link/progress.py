"""Rank 0's training progress, sent from a background thread: the training loop hands over
its latest figures and never waits on the rendezvous service.

Progress only feeds the job's status. When the service cannot be reached (the operator
restarts, its node stopped answering) the training must go on at full speed: a report that
does not arrive is dropped, and the next one carries newer figures anyway. Reports leave at
most every :data:`PROGRESS_INTERVAL_S`, the newest one last, except an urgent one (training
resumes in a new round: the driver times recoveries by it), which leaves at once. A report
that replaces one not sent yet keeps the commit durations, the checkpoints, and the
``resumed`` mark and the checkpoint loaded (same round) of the one it replaces.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final

from elasticjob.wire.messages import ProgressRequest
from elasticjob.wire.protocol import MAX_REPORTED_CHECKPOINTS, MAX_REPORTED_COMMITS
from elasticjob.worker_runtime.diagnostics.log import get_logger
from elasticjob.worker_runtime.link.rendezvous_client import RendezvousClientError

logger = get_logger(__name__)

PROGRESS_INTERVAL_S: Final = 1.0
"""Least time between two progress reports sent (the service's bounds assume it)."""


class ProgressReporter:
    """Sends the newest :class:`ProgressRequest` handed to :meth:`offer` with ``send`` (on
    its own daemon thread, at most every ``interval_s``)."""

    def __init__(
        self,
        send: Callable[[ProgressRequest], None],
        *,
        interval_s: float = PROGRESS_INTERVAL_S,
    ) -> None:
        self._send = send
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        """Notified when a report was sent (or dropped) and none waits (see :meth:`flush`)."""
        self._sending = False
        self._latest: ProgressRequest | None = None
        self._offered = threading.Event()
        self._stopped = threading.Event()
        self._hurry = threading.Event()
        """Cuts the wait between two reports short (an urgent report, or stop)."""
        self._thread: threading.Thread | None = None

    def offer(self, request: ProgressRequest, *, urgent: bool = False) -> None:
        """Hand over the newest progress (returns at once; an older one not sent yet is
        replaced, see the module docstring). ``urgent``: send it without waiting for the
        interval to pass."""
        with self._lock:
            older = self._latest
            if older is not None:
                request = request.model_copy(
                    update={
                        "commit_seconds": (older.commit_seconds + request.commit_seconds)[
                            -MAX_REPORTED_COMMITS:
                        ],
                        "resumed": request.resumed
                        or (older.resumed and older.round == request.round),
                        "checkpoints": (older.checkpoints + request.checkpoints)[
                            -MAX_REPORTED_CHECKPOINTS:
                        ],
                        "committed_step": older.committed_step
                        if request.committed_step is None
                        else request.committed_step,
                        "restored_from": request.restored_from
                        or (older.restored_from if older.round == request.round else None),
                    }
                )
            self._latest = request
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="elasticjob-progress", daemon=True
                )
                self._thread.start()
        if urgent:
            self._hurry.set()
        self._offered.set()

    def flush(self, timeout_s: float) -> bool:
        """Send what was offered now and wait, up to ``timeout_s``, until it was sent (or
        failed to); return whether it was (True when nothing was pending)."""
        self._hurry.set()
        with self._idle:
            return self._idle.wait_for(
                lambda: (self._latest is None and not self._sending) or self._stopped.is_set(),
                timeout_s,
            )

    def stop(self) -> None:
        """Send nothing more (what was not sent yet is dropped)."""
        self._stopped.set()
        self._hurry.set()
        self._offered.set()
        with self._idle:
            self._idle.notify_all()  # a flush waiting ends

    def _run(self) -> None:
        failing = False
        while True:
            self._offered.wait()
            if self._stopped.is_set():
                return
            with self._lock:
                request, self._latest = self._latest, None
                self._offered.clear()
                self._hurry.clear()
                self._sending = request is not None
            if request is None:
                continue
            try:
                self._send(request)
            except RendezvousClientError as exc:
                if not failing:
                    logger.warning("could not report progress: %s; dropping reports meanwhile", exc)
                failing = True
            else:
                if failing:
                    logger.info("progress reports arrive again")
                failing = False
            finally:
                with self._idle:
                    self._sending = False
                    self._idle.notify_all()
            self._hurry.wait(self._interval_s)
            if self._stopped.is_set():
                return
