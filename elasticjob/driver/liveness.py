"""Which worker processes stopped answering: the liveness decision, as a pure function.

Every worker process beats a heartbeat from a background thread (see
``elasticjob.worker_runtime.link.heartbeat``), whatever its training thread does. A process that
sent none for ``timeout_s`` is frozen (SIGSTOP, a hung interpreter) or cut off from the job;
a slow step or a long evaluation never stops the beat. The driver kills such a worker, and
the process's exit is then handled like any failure (ROUND_FAILED for the
survivors, its host blacklisted).

The timeout bounds detection; re-forming the round adds a second or two. The workers' beat
interval (:func:`heartbeat_interval_s`, handed to them as
:data:`~elasticjob.worker_contract.ENV_HEARTBEAT_INTERVAL`) leaves several beats per timeout, so one
delayed beat kills nobody.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from elasticjob.wire.messages import WorkerId

DEFAULT_HEARTBEAT_TIMEOUT_S: Final = 5
"""Default bound on the silence of a worker process, in seconds: detection plus re-forming
the round stays within about 10 s. Whole seconds: it is also the default of an ElasticJob's
``heartbeatTimeoutSeconds``."""

REACH_GRACE_S = 30.0
"""How long workers have to beat to a driver they could not reach (it restarted, or its
Service did not route to it) before their silence counts again: under the operator, their
beats reach an operator pod only once its Service routes to it again (readiness, endpoints,
the nodes' proxies), and a worker that cannot reach the rendezvous retries every second."""

LOOP_LAG_S = 1.0
"""How late the driver's event loop may run a timer before heartbeats count as possibly stuck
in its queues (see :meth:`Reachability.loop_ran_late`)."""

BEATS_PER_TIMEOUT = 5
"""Heartbeats a worker sends per timeout: four may be lost or late without a kill."""

MAX_HEARTBEAT_INTERVAL_S = 2.0
"""Longest interval between heartbeats, whatever the timeout."""

MIN_HEARTBEAT_INTERVAL_S = 0.1
"""Shortest interval between heartbeats (1,024 workers at 1 s are ~1,000 requests/s)."""


def heartbeat_interval_s(timeout_s: float | None) -> float | None:
    """The interval at which workers beat for a driver that kills those silent for
    ``timeout_s`` (None: the driver kills nobody, and workers need not beat)."""
    if timeout_s is None:
        return None
    if timeout_s <= 0:
        raise ValueError(f"heartbeat timeout must be > 0, got {timeout_s}")
    return min(
        max(timeout_s / BEATS_PER_TIMEOUT, MIN_HEARTBEAT_INTERVAL_S), MAX_HEARTBEAT_INTERVAL_S
    )


@dataclass
class Reachability:
    """Whether the workers can reach their driver, as the driver can tell. Under the
    operator: whether its own pod is ready (a Service routes to ready pods only; a pod on a
    node that stopped answering is marked not ready). While they cannot, their silence says
    nothing about them, and once they can again they have :data:`REACH_GRACE_S` to beat."""

    since: float | None = -math.inf
    """Since when (driver clock) they can reach it; None: they cannot now."""
    lagged_at: float = -math.inf
    """When the driver's own event loop was last seen running late (driver clock)."""

    def update(self, reachable: bool, now: float) -> bool:
        """Record whether they can reach it at ``now``; return whether that changed."""
        if reachable == (self.since is not None):
            return False
        self.since = now if reachable else None
        return True

    def loop_ran_late(self, lateness_s: float, now: float) -> bool:
        """The driver's event loop ran a timer ``lateness_s`` late at ``now``. From
        :data:`LOOP_LAG_S` on, it was too busy to keep up (a thousand workers' requests on
        one loop, see ``docs/scale.md``): beats may have waited unanswered in its queues, so
        silence counts again from ``now`` (an overloaded service would otherwise kill
        healthy workers, and re-forming rounds for them would overload it more). Returns
        whether it counts as running late."""
        if lateness_s < LOOP_LAG_S:
            return False
        self.lagged_at = max(self.lagged_at, now)
        return True

    def silence_counts_from(self) -> float | None:
        """From when a worker's silence counts (None: not at all now)."""
        if self.since is None:
            return None
        return max(self.since + REACH_GRACE_S, self.lagged_at)


def hung_workers(
    last_heartbeat: Mapping[WorkerId, float | None],
    *,
    timeout_s: float | None,
    now: float,
    counts_from: float | None = -math.inf,
) -> frozenset[WorkerId]:
    """The workers to kill: those silent for more than ``timeout_s`` before ``now``, their
    silence counted from their last heartbeat, and no earlier than ``counts_from``.

    ``last_heartbeat`` holds the running worker processes the driver supervises, with the
    time of each one's last heartbeat, or None for a process that has not beaten yet (still
    starting: the start timeout covers it). ``timeout_s`` None turns the killing off;
    ``counts_from`` None suspends it (the workers cannot reach the driver: see
    :class:`Reachability`).
    """
    if timeout_s is None or counts_from is None:
        return frozenset()
    return frozenset(
        worker
        for worker, beat in last_heartbeat.items()
        if beat is not None and now - max(beat, counts_from) > timeout_s
    )
