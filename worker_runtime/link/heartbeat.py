"""The worker's heartbeat: a daemon thread that tells the rendezvous service, every
interval, that this process is alive.

It beats whatever the training thread does (a slow step, a long evaluation, a wait in a
collective), so the driver can tell a frozen process (SIGSTOP, a host that stopped
answering), where every thread stops, from a slow one. It beats until the interpreter exits
(work after the training loop, an evaluation or a save, beats too); at exit, once the driver
knows how the process ends, it stops: the driver then gives the teardown a grace period and
stops a process whose teardown hangs (``elasticjob.driver.timeouts.overdue_endings``).

While the training thread is blocked in a collective, each beat also carries what probing
the round's peers found (``probe``, see ``reachability.py``), so the driver can kill a
member its peers cannot reach instead of waiting for the collective timeout.

It is also how a worker notices that it was orphaned: when no beat has arrived for the orphan
timeout (the launcher died, the operator is gone for good), it calls ``on_orphaned``, which
ends the process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from elasticjob.wire.messages import HeartbeatRequest, HeldShards, ProbedPeer, StepPace
from elasticjob.worker_runtime.diagnostics.log import get_logger
from elasticjob.worker_runtime.link.rendezvous_client import RendezvousClient, RendezvousClientError

logger = get_logger(__name__)


ProbeResult = tuple[int, tuple[ProbedPeer, ...]]
"""A round whose collective blocks, and the peers of it that did not answer a probe."""


class Heartbeat:
    """Beats for worker ``hostname[local_rank]`` every ``interval_s`` once started; calls
    ``on_orphaned`` (on the heartbeat thread) once no beat arrived for ``orphan_timeout_s``
    (0: never). Before each beat it calls ``probe`` (on the heartbeat thread; it must take
    less than the interval) and sends its result with the beat (None: nothing to report),
    with the worker's step ``pace`` (``step_pace.py``) and what it ``held`` of a sharded
    state's last confirmed commit then."""

    def __init__(
        self,
        client: RendezvousClient,
        hostname: str,
        local_rank: int,
        interval_s: float,
        *,
        orphan_timeout_s: float = 0.0,
        on_orphaned: Callable[[float], None] | None = None,
        probe: Callable[[], ProbeResult | None] = lambda: None,
        pace: Callable[[], StepPace | None] = lambda: None,
        held: Callable[[], HeldShards | None] = lambda: None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"heartbeat interval must be > 0, got {interval_s}")
        self._client = client
        self._request = HeartbeatRequest(hostname=hostname, local_rank=local_rank)
        self._probe = probe
        self._pace = pace
        self._held = held
        self._interval_s = interval_s
        self._orphan_timeout_s = orphan_timeout_s
        self._on_orphaned = on_orphaned
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="elasticjob-heartbeat", daemon=True)

    def start(self) -> None:
        """Start beating (the first beat is sent at once)."""
        self._thread.start()

    def stop(self) -> None:
        """Send no more beats (a beat under way still arrives). Thread-safe."""
        self._stopped.set()
        self._wake.set()

    def beat_now(self) -> None:
        """Send the next beat (and its probe) at once rather than on schedule. Thread-safe."""
        self._wake.set()

    def _run(self) -> None:
        failing = False
        next_beat = last_arrived = time.monotonic()
        while not self._stopped.is_set():
            request = self._request.model_copy(
                update={"pace": self._pace(), "held_shards": self._held()}
            )
            if (found := self._probe()) is not None:
                request = request.model_copy(update={"round": found[0], "unreachable": found[1]})
            try:
                self._client.heartbeat(request)
            except RendezvousClientError as exc:
                if not failing:
                    logger.warning("%s; still trying every %.1f s", exc, self._interval_s)
                failing = True
                silent = time.monotonic() - last_arrived
                if self._on_orphaned and 0 < self._orphan_timeout_s <= silent:
                    self._on_orphaned(silent)
                    return
            else:
                if failing:
                    logger.info("heartbeats arrive again")
                failing = False
                last_arrived = time.monotonic()
            # Beat on a fixed schedule: a slow request does not push the next beat back.
            now = time.monotonic()
            next_beat = max(next_beat + self._interval_s, now)
            if self._wake.wait(next_beat - now):
                self._wake.clear()
                next_beat = time.monotonic()
