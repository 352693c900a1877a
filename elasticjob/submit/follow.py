"""``elasticjob submit --follow`` and ``elasticjob logs -f``: rank 0's log as it is written, the
job's story (rounds formed, failures, recoveries: its ``status.history``) between its lines,
and at the end the job's phase, its message and an exit code (0: Succeeded).

What to print is decided from the job's statuses by pure functions (:func:`news`,
:func:`rank_pod`); :func:`follow` watches the job (its changes are pushed, nothing is polled)
and streams the log of whichever pod holds rank 0, switching when another does.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final

from elasticjob.operator.finished_jobs import ENDED_PHASES
from elasticjob.submit.job_client import JobClient

logger = logging.getLogger(__name__)

PREFIX: Final = "[elasticjob]"
"""What starts the lines that tell the job's story rather than rank 0's log."""

WATCH_S: Final = 60
"""How long one watch request lasts before it is made again."""

SWITCH_LOOKBACK_S: Final = 5
"""When another pod comes to hold the rank, its log is printed from this long before."""

LOG_RETRY_S: Final = 1.0
"""How soon a log that cannot be read yet (its container is starting) is asked for again."""

DRAIN_S: Final = 10.0
"""How long, once the job ended, rank 0's log is read on to its end."""


def rank_pod(status: Mapping[str, Any], rank: int = 0) -> str | None:
    """The pod that holds ``rank`` in the job's round (None: none does now)."""
    for worker in status.get("workers") or []:
        if rank in (worker.get("ranks") or []):
            return str(worker["pod"])
    return None


def news(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> list[str]:
    """What changed from status ``before`` (None: nothing seen yet) to ``after``: the story's
    new lines, and a new phase with its reason and message."""
    before = before or {}
    seen = set(before.get("history") or [])
    lines = [f"{PREFIX} {line}" for line in after.get("history") or [] if line not in seen]
    phase = after.get("phase")
    if phase and phase != before.get("phase"):
        reason, message = phase_condition(after, str(phase))
        told = f" ({reason})" if reason else ""
        lines.append(f"{PREFIX} {phase}{told}" + (f": {message}" if message else ""))
    return lines


def phase_condition(status: Mapping[str, Any], phase: str) -> tuple[str | None, str | None]:
    """The reason and message of the condition of ``phase``, True in ``status``."""
    for condition in status.get("conditions") or []:
        if condition.get("type") == phase and condition.get("status") == "True":
            return condition.get("reason"), condition.get("message")
    return None, None


def exit_code(status: Mapping[str, Any]) -> int | None:
    """The command's exit code for the job's status: 0 Succeeded, 1 Failed, None running."""
    phase = status.get("phase")
    return None if phase not in ENDED_PHASES else 0 if phase == "Succeeded" else 1


class _LogTail:
    """Streams one pod's log lines to ``out`` in a thread, until the pod's container ends or
    :meth:`stop`."""

    def __init__(
        self, client: JobClient, pod: str, out: Callable[[str], None], since_s: int | None
    ):
        self.pod = pod
        self._response: Any = None
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(client, out, since_s), name=f"log {pod}", daemon=True
        )
        self._thread.start()

    def _run(self, client: JobClient, out: Callable[[str], None], since_s: int | None) -> None:
        while not self._stopped.is_set():
            try:
                lines, self._response = client.log_lines(self.pod, follow=True, since_s=since_s)
                for line in lines:
                    if self._stopped.is_set():
                        return
                    out(line)
                return  # the container ended
            except Exception as exc:  # its container has not started yet, or the pod went
                logger.debug("log of %s: %s", self.pod, exc)
            self._stopped.wait(LOG_RETRY_S)

    def stop(self, drain_s: float = 0.0) -> None:
        """Stop, after reading on for up to ``drain_s`` (the container's last lines)."""
        self._thread.join(drain_s)
        self._stopped.set()
        if self._response is not None:
            self._response.close()


def follow(client: JobClient, name: str, out: Callable[[str], None] = print, rank: int = 0) -> int:
    """Print the job's story and the log of ``rank`` until the job ends; return the exit code
    (0 Succeeded, 1 Failed or deleted)."""
    before: Mapping[str, Any] | None = None
    tail: _LogTail | None = None
    try:
        while True:
            for kind, job in client.watch(name, WATCH_S):
                if kind == "DELETED":
                    out(f"{PREFIX} job {name} was deleted")
                    return 1
                status = job.get("status") or {}
                lines, before = news(before, status), status
                pod = rank_pod(status, rank)
                if pod is not None and (tail is None or tail.pod != pod):
                    since = None if tail is None else SWITCH_LOOKBACK_S
                    if tail is not None:  # the rank moved: the new pod's log from about now
                        tail.stop()
                    tail = _LogTail(client, pod, out, since)
                code = exit_code(status)
                if code is not None and tail is not None:
                    tail.stop(DRAIN_S)  # its last lines before the verdict
                    tail = None
                for line in lines:
                    out(line)
                if code is not None:
                    return code
    finally:
        if tail is not None:
            tail.stop()
