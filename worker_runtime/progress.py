"""Rank 0's training progress, sent from a background thread: the training loop hands over
its latest figures and never waits on the rendezvous service.

Progress only feeds the job's status. When the service cannot be reached (the operator
restarts, its node stopped answering) the training must go on at full speed: a report that
does not arrive is dropped, and the next one carries newer figures anyway. Reports leave at
most every :data:`PROGRESS_INTERVAL_S`, the newest one last.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final

from elasticjob.wire import ProgressRequest
from elasticjob.worker_runtime.log import get_logger
from elasticjob.worker_runtime.rendezvous_client import RendezvousClientError

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
        self._latest: ProgressRequest | None = None
        self._offered = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def offer(self, request: ProgressRequest) -> None:
        """Hand over the newest progress (returns at once; an older one not sent yet is
        replaced)."""
        with self._lock:
            self._latest = request
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="elasticjob-progress", daemon=True
                )
                self._thread.start()
        self._offered.set()

    def stop(self) -> None:
        """Send nothing more (what was not sent yet is dropped)."""
        self._stopped.set()
        self._offered.set()

    def _run(self) -> None:
        failing = False
        while True:
            self._offered.wait()
            if self._stopped.is_set():
                return
            with self._lock:
                request, self._latest = self._latest, None
                self._offered.clear()
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
            if self._stopped.wait(self._interval_s):
                return
