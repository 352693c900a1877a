"""The second half of a sharded commit, overlapped with training: the copies sent to the ranks
that keep them and a barrier that confirms the commit, on a thread of their own.

``ShardedState.commit()`` snapshots this rank's shards at once (the live ones change at the
next step) and its commit pipeline (``shard_pipeline.py``) hands the snapshot to
:class:`CopiesInFlight`; the training thread goes on.
The thread moves the copies over the round's *host group*, a Gloo group beside the round's
own: the copies are host memory whatever the training backend, and the training thread's
collectives on the round's group keep their order. Once this rank's transfers are done the
commit is pending here; once the barrier is passed it is confirmed (``shard_commits.py``).

A failed transfer (a peer died) is reported to ``on_failure``: the pipeline aborts the round's
group (unless the round is over by then), as a failed collective does, so the training
thread fails at its next collective instead of waiting out a timeout.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import torch.distributed as dist

from elasticjob.worker_runtime.elastic.sharded.shard_exchange import (
    Shards,
    exchange_copies,
    wait_all,
)
from elasticjob.worker_runtime.elastic.sharded.shard_layout import MeshLayout
from elasticjob.worker_runtime.elastic.sharded.shard_snapshot import ShardSnapshot
from elasticjob.worker_runtime.exceptions import HorovodInternalError

logger = logging.getLogger(__name__)


class Outcome(enum.Enum):
    """How far a commit's second half got on this rank."""

    RUNNING = "running"
    """Still moving copies or waiting at the barrier."""
    FAILED = "failed"
    """A transfer failed: this rank holds its own snapshot, not its copies."""
    PENDING = "pending"
    """This rank's transfers are done; the barrier was not passed."""
    CONFIRMED = "confirmed"
    """The barrier was passed: every member of the round holds the commit."""


class CopiesInFlight:
    """Sends ``snapshot``'s shards to their ``holders`` (ranks of the round's ``layout``) and
    receives the copies this rank keeps, then passes a barrier, all on ``group`` and on a
    thread of its own; a failure is told to ``on_failure(group, reason)``, on that
    thread."""

    def __init__(
        self,
        snapshot: ShardSnapshot,
        layout: MeshLayout,
        holders: Mapping[int, Sequence[int]],
        group: dist.ProcessGroup,
        on_failure: Callable[[dist.ProcessGroup, str], None],
    ) -> None:
        self._snapshot = snapshot
        self._layout = layout
        self._on_failure = on_failure
        self._holders = holders
        self._group: dist.ProcessGroup | None = group
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._outcome = Outcome.RUNNING
        self._copies: dict[int, Shards] = {}
        self.seconds = 0.0
        """How long the copies and the barrier took (once settled)."""
        self._thread = threading.Thread(target=self._run, name="shard-copies", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        started = time.monotonic()
        group, self._group = self._group, None  # the only reference: this thread's
        assert group is not None
        snapshot = self._snapshot
        copies: dict[int, Shards] | None = None
        try:
            rank = group.rank()  # the host group is the whole round, in its order
            copies = exchange_copies(snapshot.sharded, self._layout, rank, self._holders, group)
            self._advance(Outcome.PENDING, copies)
            wait_all([dist.barrier(group=group, async_op=True)], "the commit's barrier")
            self._advance(Outcome.CONFIRMED, copies)
        except HorovodInternalError as exc:
            logger.info("a commit's copies or barrier did not complete: %s", exc)
            if copies is None:  # past the transfers, the commit stays pending here
                self._advance(Outcome.FAILED, {})
            self._on_failure(group, str(exc))
        finally:
            del group
            self.seconds = time.monotonic() - started
            self._done.set()

    def _advance(self, outcome: Outcome, copies: dict[int, Shards]) -> None:
        with self._lock:
            self._outcome, self._copies = outcome, copies

    def settle(self, timeout_s: float | None) -> tuple[Outcome, dict[int, Shards]]:
        """Wait up to ``timeout_s`` (None: as long as it takes) for the thread to end; return
        how far it got and the copies this rank holds (complete ones only). A thread still
        running then is left to itself: what it does later is not used."""
        self._done.wait(timeout_s)
        with self._lock:
            outcome, copies = self._outcome, self._copies
        if outcome is Outcome.RUNNING:
            logger.warning("a commit's copies were still moving after %s s: given up", timeout_s)
            return Outcome.FAILED, {}
        return outcome, copies
