"""Gloo groups whose waits end with the round: the groups of a sharded state's device mesh.

torch issues FSDP2's collectives (all-gathers, reduce-scatters, HSDP's all-reduces across
replicas) on the device mesh's groups and waits for them itself. On a plain Gloo group
nothing interrupts that wait: when a member vanishes inside one without a reset reaching the
others (a node lost, a frozen process), the driver fails the round at once but the survivors
would wait until the group's timeout (``collectiveTimeoutSeconds``).

A group of this module's backend (:data:`BACKEND`, chosen by :func:`mesh_backends`) issues
each collective on a Gloo group of the same members and gives torch a work whose ``wait``
goes through the round's :meth:`RoundGroup.wait <.process_group.RoundGroup.wait>`: it returns
when the collective completes and raises :class:`HorovodInternalError` the moment the round's
group is aborted (the driver's notice). A collective issued after the abort raises at once.
Nothing else changes: the same Gloo algorithms run on the same tensors.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable
from typing import Final, Protocol

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import GroupName

from elasticjob.worker_runtime.exceptions import HorovodInternalError
from elasticjob.worker_runtime.rounds.process_group import RoundGroup

BACKEND: Final = "elasticgloo"
"""The backend's name (``torch.distributed.get_backend`` of a mesh's group)."""

COLLECTIVES: Final = (
    "allreduce",
    "allreduce_coalesced",
    "allgather",
    "allgather_coalesced",
    "_allgather_base",
    "allgather_into_tensor_coalesced",
    "all_gather_single",
    "all_gather_single_coalesced",
    "reduce",
    "reduce_scatter",
    "_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced",
    "reduce_scatter_single",
    "reduce_scatter_single_coalesced",
    "broadcast",
    "gather",
    "scatter",
    "alltoall",
    "alltoall_base",
    "all_to_all_single",
    "send",
    "recv",
    "recv_anysource",
    "barrier",
)
"""The operations a group of this backend issues on its Gloo group (those this torch has)."""

_CPU: Final = torch.device("cpu")


class GroupOptions(Protocol):
    """What torch tells a backend's maker of the group to make (its
    ``_DistributedBackendOptions``)."""

    store: dist.Store
    group_rank: int
    group_size: int
    timeout: datetime.timedelta
    group_id: GroupName


class _GlooWork:
    """A Gloo work as the round's group waits for one: through a future. Some of Gloo's
    works have none (they do their transfer inside ``wait``): a thread waits for those and
    completes a future of their outcome."""

    def __init__(self, work: dist.Work) -> None:
        self._work = work
        self._future: torch.futures.Future[object] | None = None
        self._threaded = False
        self._lock = threading.Lock()

    def get_future(self) -> torch.futures.Future[object]:
        with self._lock:
            if self._future is None:
                try:
                    self._future = self._work.get_future()
                except RuntimeError:  # "Work::getFuture not implemented"
                    self._future = torch.futures.Future()
                    self._threaded = True
                    threading.Thread(
                        target=self._wait_on_thread, name="gloo work", daemon=True
                    ).start()
            return self._future

    def _wait_on_thread(self) -> None:
        assert self._future is not None
        try:
            self._work.wait()
        except (RuntimeError, dist.DistError) as exc:
            self._future.set_exception(exc)
            return
        self._future.set_result(None)

    def wait(self) -> bool:
        if not self._threaded:
            return bool(self._work.wait())
        assert self._future is not None
        self._future.wait()  # raises the work's failure
        return True


class _RoundWork(dist.Work):
    """The work torch gets: waited for through the round's group."""

    def __init__(self, work: dist.Work, round_group: RoundGroup, operation: str) -> None:
        super().__init__()
        self._work = _GlooWork(work)
        self._round = round_group
        self._operation = operation
        self._done = False

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        if not self._done:
            self._round.wait(self._work, self._operation)
            self._done = True
        return True

    def get_future(self) -> torch.futures.Future[object]:
        return self._work.get_future()

    def is_completed(self) -> bool:
        return self._done or self._work.get_future().done()


class RoundBoundGloo(dist.ProcessGroup):
    """A process group of the round whose collectives run on Gloo and whose waits end with
    the round (see the module's docstring)."""

    def __init__(self, options: GroupOptions, round_group: RoundGroup) -> None:
        rank, size = options.group_rank, options.group_size
        # (rank, size): the constructor torch has for a group written in Python (its stubs
        # name only the one with a store).
        super().__init__(rank, size)  # type: ignore[call-arg]
        gloo = dist.ProcessGroupGloo(options.store, rank, size, options.timeout)
        issuer = dist.ProcessGroup(options.store, rank, size)
        issuer._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
        issuer._register_backend(_CPU, dist.ProcessGroup.BackendType.GLOO, gloo)
        issuer._set_group_name(options.group_id)
        # torch names a group after its backend's name, and calls it for what this class
        # does not override (its shutdown at the round's end).
        self._register_backend(_CPU, dist.ProcessGroup.BackendType.CUSTOM, gloo)
        self._set_group_name(options.group_id)
        self._issuer = issuer
        self._round = round_group

    def getBackendName(self) -> str:
        return BACKEND


def _issuing(name: str) -> Callable[..., _RoundWork]:
    def issue(self: RoundBoundGloo, *args: object) -> _RoundWork:
        reason = self._round.errored()
        if reason is not None:
            raise HorovodInternalError(reason)
        return _RoundWork(getattr(self._issuer, name)(*args), self._round, name)

    issue.__name__ = name
    return issue


for _name in COLLECTIVES:
    if hasattr(dist.ProcessGroup, _name):
        setattr(RoundBoundGloo, _name, _issuing(_name))

_lock = threading.Lock()
_round: RoundGroup | None = None
_registered = False


def _create(options: GroupOptions, _backend_options: object) -> RoundBoundGloo:
    with _lock:
        round_group = _round
    if round_group is None:
        raise HorovodInternalError(f"a {BACKEND} group is made only in a round")
    return RoundBoundGloo(options, round_group)


def mesh_backends(round_group: RoundGroup, dims: int) -> tuple[tuple[str | None, None], ...]:
    """The ``backend_override`` of a ``DeviceMesh`` of ``dims`` dimensions made in the round
    of ``round_group``: this module's backend on Gloo, the round's own otherwise (an NCCL
    group's abort already ends the waits on it)."""
    global _round, _registered
    if round_group.backend != "gloo":
        return ((None, None),) * dims
    with _lock:
        _round = round_group
        if not _registered:
            dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
            _registered = True
    return ((BACKEND, None),) * dims
