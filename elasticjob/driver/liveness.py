"""Which worker processes stopped answering: the liveness decision, as a pure function.

Every worker process beats a heartbeat from a background thread (see
``elasticjob.worker_runtime.heartbeat``), whatever its training thread does. A process that
sent none for ``timeout_s`` is frozen (SIGSTOP, a hung interpreter) or cut off from the job;
a slow step or a long evaluation never stops the beat. The driver evicts such a worker: it
kills it, and the process's exit is then handled like any failure (ROUND_FAILED for the
survivors, its host blacklisted).

The timeout bounds detection; re-forming the round adds a second or two. The workers' beat
interval (:func:`heartbeat_interval_s`, handed to them as
:data:`~elasticjob.wire.ENV_HEARTBEAT_INTERVAL`) leaves several beats per timeout, so one
delayed beat is no eviction.
"""

from __future__ import annotations

from collections.abc import Mapping

from elasticjob.wire import WorkerId

DEFAULT_HEARTBEAT_TIMEOUT_S = 5.0
"""Default bound on the silence of a worker process: detection plus re-forming the round
stays within about 10 s."""

BEATS_PER_TIMEOUT = 5
"""Heartbeats a worker sends per timeout: four may be lost or late without an eviction."""

MAX_HEARTBEAT_INTERVAL_S = 2.0
"""Longest interval between heartbeats, whatever the timeout."""

MIN_HEARTBEAT_INTERVAL_S = 0.1
"""Shortest interval between heartbeats (1,024 workers at 1 s are ~1,000 requests/s)."""


def heartbeat_interval_s(timeout_s: float | None) -> float | None:
    """The interval at which workers beat for a driver evicting after ``timeout_s`` (None:
    the driver evicts nobody, and workers need not beat)."""
    if timeout_s is None:
        return None
    if timeout_s <= 0:
        raise ValueError(f"heartbeat timeout must be > 0, got {timeout_s}")
    return min(
        max(timeout_s / BEATS_PER_TIMEOUT, MIN_HEARTBEAT_INTERVAL_S), MAX_HEARTBEAT_INTERVAL_S
    )


def hung_workers(
    last_heartbeat: Mapping[WorkerId, float | None], *, timeout_s: float | None, now: float
) -> frozenset[WorkerId]:
    """The workers to evict: those whose last heartbeat is more than ``timeout_s`` before
    ``now``.

    ``last_heartbeat`` holds the running worker processes the driver supervises, with the
    time of each one's last heartbeat, or None for a process that has not beaten yet (still
    starting: the start timeout covers it). ``timeout_s`` None turns eviction off.
    """
    if timeout_s is None:
        return frozenset()
    return frozenset(
        worker
        for worker, beat in last_heartbeat.items()
        if beat is not None and now - beat > timeout_s
    )
