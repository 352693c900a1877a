"""The process group of one round, with a configure / abort / errored contract.

Every round gets a fresh default ``torch.distributed`` group on a fresh store prefix; the
previous one is destroyed first. A broken one is aborted and detached at once, and shut down
on a background thread (``group_teardown.py``): its backend may still wait out an abandoned
collective, which the next round must not wait for.

Collectives are issued asynchronously and waited on here, so a group can be abandoned the
moment the driver announces that a member failed (:meth:`RoundGroup.abort`, called from the
notice thread): Gloo would otherwise block a survivor until its timeout when the dead peer is
not its direct neighbour. The groups of a sharded state's device mesh, on whose collectives
torch waits itself (FSDP2's), wait through :meth:`RoundGroup.wait` too (``abortable_gloo.py``).
A bounded timeout is the last resort, for every group made in the round
(:func:`bound_new_groups`): a script's own groups, the forming of a group.

Every blocking operation on a round's group (a collective, forming the group) runs inside
:meth:`RoundGroup.blocking`, so the heartbeat thread can tell how long the training thread
has been blocked (:meth:`RoundGroup.blocked_for`) and probe its peers when it is too long.

Collectives that ``torch`` itself waits for (a ``DistributedDataParallel`` comm hook's) go
through :meth:`RoundGroup.future` instead: a future that fails the moment the group is
aborted, and counts as blocking while it is pending. Objects that hold the round's group
(a DDP wrapper's reducer) let go of it when the group is destroyed
(:meth:`RoundGroup.on_destroy`), so that the last reference to a broken group is the one
its teardown thread drops.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore, Store

from elasticjob.worker_runtime.collectives.negotiation import Negotiation
from elasticjob.worker_runtime.diagnostics import timeline
from elasticjob.worker_runtime.diagnostics.log import get_logger, stacks_if_stuck
from elasticjob.worker_runtime.exceptions import HorovodInternalError
from elasticjob.worker_runtime.rounds.abortable_store import AbortableStore
from elasticjob.worker_runtime.rounds.group_teardown import (
    destroy_default_group,
    tear_down_in_background,
)

logger = get_logger(__name__)


class _Work(Protocol):
    def get_future(self) -> torch.futures.Future[object]: ...

    def wait(self) -> bool: ...


@dataclass(eq=False)
class _Pending:
    """A collective being waited on."""

    event: threading.Event
    completed: bool = False
    abandoned: bool = False
    future: torch.futures.Future[object] | None = None
    """Set for :meth:`RoundGroup.future`: settled once, by the work or by an abort."""
    settled: bool = False


def bound_new_groups(timeout: datetime.timedelta) -> None:
    """Give every process group made from now on ``timeout`` unless its maker passes one:
    this runtime's, a ``DeviceMesh``'s groups of its dimensions (FSDP2's HSDP), the script's
    own ``new_group``. torch gives such a group 30 minutes, not its default group's timeout,
    so a member that vanished mid-round (no reset reaches the others) would hold them for
    half an hour in a collective that nothing else can interrupt, or in forming a group."""
    c10d = dist.distributed_c10d
    c10d.default_pg_timeout = timeout
    if hasattr(c10d, "default_pg_nccl_timeout"):
        c10d.default_pg_nccl_timeout = timeout


class RoundGroup:
    """Owns the default process group of the current round."""

    def __init__(self, backend: str, device: torch.device) -> None:
        self.backend = backend
        self.device = device
        self._lock = threading.Lock()
        self._error: str | None = None
        self._aborted = threading.Event()
        self._waiters: set[_Pending] = set()
        self._abandoned = 0
        self._configured = False
        self._blocked_since: float | None = None
        self._blocking_depth = 0
        self._blocked_total = 0.0
        self._on_destroy: list[weakref.WeakMethod[Callable[[], None]]] = []
        self._negotiation: Negotiation | None = None
        self._subsets: list[Negotiation] = []
        self._formed: tuple[Store, str, int] | None = None
        self._groups_store: AbortableStore | None = None
        """The store the round's groups form on, kept as long as they live (see
        ``abortable_store.py``)."""
        self.generation = 0
        """Counts the groups formed: a process set registered in one is void in the next."""

    @contextlib.contextmanager
    def blocking(self) -> Iterator[None]:
        """Mark a blocking operation on the round's group (nested ones count as one, from
        the outermost's start)."""
        self._enter_blocking()
        try:
            yield
        finally:
            self._leave_blocking()

    def _enter_blocking(self) -> None:
        with self._lock:
            if self._blocking_depth == 0:
                self._blocked_since = time.monotonic()
            self._blocking_depth += 1

    def _leave_blocking(self) -> None:
        with self._lock:
            self._blocking_depth -= 1
            if self._blocking_depth == 0:
                if self._blocked_since is not None:
                    self._blocked_total += time.monotonic() - self._blocked_since
                self._blocked_since = None

    def on_destroy(self, release: Callable[[], None]) -> None:
        """Call the bound method ``release`` whenever a group is destroyed, before it goes
        (held weakly: an object that registered itself stays collectable)."""
        self._on_destroy.append(weakref.WeakMethod(release))

    def blocked_total(self) -> float:
        """Seconds spent in blocking operations on the groups so far, those ended (a step's
        wait for the other ranks: ``step_pace.py``). Thread-safe."""
        with self._lock:
            return self._blocked_total

    def blocked_for(self) -> float | None:
        """Seconds the current blocking operation has lasted (None: none runs). Thread-safe."""
        with self._lock:
            since = self._blocked_since
        return None if since is None else time.monotonic() - since

    def configure(
        self,
        store: Store,
        prefix: str,
        rank: int,
        size: int,
        timeout: datetime.timedelta,
    ) -> None:
        """Destroy the previous group and form a new one of ``size`` ranks on the store keys
        under ``prefix``. Raises :class:`HorovodInternalError` if forming it fails."""
        self.destroy()
        with self._lock:
            self._error = None
            self._aborted.clear()
        bound_new_groups(timeout)
        groups_store: Store = PrefixStore(prefix, store)
        if self.backend == "gloo":
            # Every group of the round forms on this store: their forming ends with the
            # round. (NCCL's own threads use the store too, and an abort of its
            # communicators unblocks its waits.)
            groups_store = self._groups_store = AbortableStore(groups_store, self._aborted.is_set)
        kwargs: dict[str, object] = {}
        if self.backend == "nccl":
            kwargs["device_id"] = self.device
        try:
            with self.blocking():
                dist.init_process_group(
                    self.backend,
                    store=groups_store,
                    rank=rank,
                    world_size=size,
                    timeout=timeout,
                    **kwargs,  # type: ignore[arg-type]
                )
            # Beside the round's group, the group its negotiated collectives run on
            # (negotiation.py): made now, while every member is here, in the same order.
            with self.blocking():
                negotiated = dist.new_group()
        except (RuntimeError, dist.DistError) as exc:
            raise HorovodInternalError(f"forming the process group failed: {exc}") from exc
        round_store = PrefixStore(f"{prefix}negotiation/", store) if size > 1 else None
        self._negotiation = Negotiation(round_store, rank, size, negotiated, self.device)
        self._formed = (store, prefix, rank)
        self.generation += 1
        self._configured = True

    def subset_negotiation(self, ranks: Sequence[int], tag: str) -> Negotiation | None:
        """A group of the round's ``ranks`` (a collective: every member of the round calls it,
        in the same order) and the negotiation of its collectives, under the store keys
        ``tag``; None on a rank that is not in ``ranks``."""
        if self._formed is None:
            raise HorovodInternalError("no process group: the round has not been formed")
        store, prefix, rank = self._formed
        try:
            with self.blocking():
                group = dist.new_group(list(ranks))
        except (RuntimeError, dist.DistError) as exc:
            raise HorovodInternalError(f"forming a process set's group failed: {exc}") from exc
        if rank not in ranks:
            return None
        subset_store = PrefixStore(f"{prefix}negotiation/{tag}/", store) if len(ranks) > 1 else None
        position = list(ranks).index(rank)
        negotiation = Negotiation(subset_store, position, len(ranks), group, self.device)
        self._subsets.append(negotiation)
        return negotiation

    @property
    def negotiation(self) -> Negotiation:
        """The negotiation of the current round's collectives (see ``negotiation.py``)."""
        negotiation = self._negotiation
        if negotiation is None:
            raise HorovodInternalError("no process group: the round has not been formed")
        return negotiation

    def abort(self, reason: str) -> None:
        """Mark the group broken and wake every collective waiting on it. Thread-safe."""
        with self._lock:
            if self._error is None:
                self._error = reason
            waiters = list(self._waiters)
        self._aborted.set()
        for pending in waiters:
            pending.event.set()
            if pending.future is not None:
                self._settle(pending, None)
        if self.backend == "nccl" and self._configured:
            # NCCL kernels of a broken group never finish on their own: abort the
            # communicators now, which also unblocks collectives issued outside this module
            # (DistributedDataParallel's gradient hooks).
            self._abort_backend()

    def errored(self) -> str | None:
        """Why the group was aborted, or None while it is healthy."""
        with self._lock:
            return self._error

    def await_abort(self, timeout_s: float) -> str | None:
        """Wait up to ``timeout_s`` for the group to be aborted (a collective of the script's
        own failed: a peer died, and the driver's notice is on its way); why it was, or
        None."""
        self._aborted.wait(timeout_s)
        return self.errored()

    @property
    def abandoned(self) -> int:
        """Collectives given up on when their group was aborted that have not finished yet:
        backend threads still hold an old group's sockets for them until its timeout."""
        with self._lock:
            return self._abandoned

    def wait(self, work: _Work, name: str | None = None) -> None:
        """Wait for an asynchronous collective, or raise as soon as the group is aborted;
        ``name``: the collective's on the timeline (default: the public function waiting)."""
        started = timeline.now()
        if started is None:
            self._wait(work)
            return
        name = name or timeline.collective_name()
        try:
            self._wait(work)
        except HorovodInternalError as exc:
            timeline.span(name, started, cat="collective", failed=str(exc))
            raise
        timeline.span(name, started, cat="collective")

    def _wait(self, work: _Work) -> None:
        pending = _Pending(threading.Event())
        with self._lock:
            if self._error is not None:
                raise HorovodInternalError(self._error)
            self._waiters.add(pending)
        work.get_future().add_done_callback(lambda _future: self._complete(pending))
        with self.blocking():
            pending.event.wait()
        with self._lock:
            self._waiters.discard(pending)
            reason = self._error
            if reason is not None and not pending.completed:
                pending.abandoned = True
                self._abandoned += 1
        if reason is not None:
            raise HorovodInternalError(reason)
        try:
            work.wait()
        except (RuntimeError, dist.DistError) as exc:
            self.abort(f"collective failed: {exc}")
            raise HorovodInternalError(f"collective failed: {exc}") from exc

    def _complete(self, pending: _Pending) -> None:
        with self._lock:
            pending.completed = True
            if pending.abandoned:
                self._abandoned -= 1
        pending.event.set()

    def future(self, work: _Work) -> torch.futures.Future[object]:
        """A future of the asynchronous collective ``work`` for ``torch`` to wait on (a DDP
        comm hook returns it): it completes with the work, or fails with
        :class:`HorovodInternalError` as soon as the group is aborted; a failed work aborts
        the group."""
        result: torch.futures.Future[object] = torch.futures.Future()
        pending = _Pending(threading.Event(), future=result)
        self._enter_blocking()
        with self._lock:
            reason = self._error
            if reason is None:
                self._waiters.add(pending)
        if reason is not None:
            self._leave_blocking()
            result.set_exception(HorovodInternalError(reason))
            return result
        work.get_future().add_done_callback(lambda done: self._settle(pending, done))
        return result

    def _settle(self, pending: _Pending, done: torch.futures.Future[object] | None) -> None:
        """Settle a :meth:`future` once: with its work's outcome (``done``), or, when
        ``done`` is None, with the group's error (an abort)."""
        with self._lock:
            first = not pending.settled
            pending.settled = True
            self._waiters.discard(pending)
            if done is not None:
                pending.completed = True
                if pending.abandoned:
                    self._abandoned -= 1
            elif first:
                pending.abandoned = True
                self._abandoned += 1
            reason = self._error
        if not first:
            return
        self._leave_blocking()
        assert pending.future is not None
        if done is None:
            pending.future.set_exception(HorovodInternalError(str(reason)))
            return
        try:
            value = done.value()
        except (RuntimeError, dist.DistError) as exc:
            self.abort(f"collective failed: {exc}")
            pending.future.set_exception(HorovodInternalError(f"collective failed: {exc}"))
            return
        pending.future.set_result(value)

    @stacks_if_stuck()
    def destroy(self) -> None:
        """Tear the current group down. A broken group is aborted, detached from
        ``torch.distributed`` at once and shut down on a background thread: its backend may
        hold an abandoned collective until the group's timeout, and the next round must not
        wait for that."""
        if not self._configured:
            return
        for release in list(self._on_destroy):
            method = release()
            if method is None:
                self._on_destroy.remove(release)
            else:
                method()
        self._configured = False
        negotiations = [*self._subsets, *([self._negotiation] if self._negotiation else [])]
        self._negotiation, self._subsets, self._formed = None, [], None
        for negotiation in negotiations:
            negotiation.close()
        if self.errored() is None:
            destroy_default_group()
            return
        self._abort_backend()
        tear_down_in_background()

    def _abort_backend(self) -> None:
        negotiations = [*self._subsets, *([self._negotiation] if self._negotiation else [])]
        try:
            dist.distributed_c10d._get_default_group().abort()
            for negotiation in negotiations:
                negotiation.group.abort()
        except (RuntimeError, ValueError) as exc:
            logger.debug("aborting the process group: %s", exc)
