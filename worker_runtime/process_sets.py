"""Horovod's process sets, limited to the global one.

Every collective here runs on the current round's whole group, whose membership changes with
each round; a process set naming a subset of ranks would not survive a resize, so only the
global set exists: :data:`global_process_set`, or a :class:`ProcessSet` listing every rank of
the current round. Anything else raises :class:`NotImplementedError` when it is built.
"""

from __future__ import annotations

from collections.abc import Iterable

from elasticjob.worker_runtime.basics import current


class ProcessSet:
    """The set of all processes of the current round (Horovod's ``hvd.ProcessSet``).

    ``ProcessSet(ranks)`` is accepted only when ``ranks`` lists every rank of the current
    round (an empty list, as Horovod builds its own global set, means the same); its
    :meth:`ranks`, :meth:`size` and :meth:`rank` follow the job as it is resized."""

    process_set_id = 0

    def __init__(self, ranks_or_comm: Iterable[int]) -> None:
        if isinstance(ranks_or_comm, str | bytes) or not isinstance(ranks_or_comm, Iterable):
            raise NotImplementedError(
                "ProcessSet from an MPI communicator: elasticjob has no MPI; use "
                "hvd.global_process_set"
            )
        ranks = sorted(ranks_or_comm)
        if any(not isinstance(r, int) for r in ranks):
            raise ValueError("ProcessSet takes a list of ranks")
        if ranks and ranks != list(range(current().slot.size)):
            raise NotImplementedError(
                f"ProcessSet({ranks}): elasticjob supports only the global process set (every "
                f"rank of the round, now {current().slot.size}); subsets would not survive an "
                "elastic resize. Use hvd.global_process_set"
            )

    @property
    def ranks(self) -> list[int]:
        """Every rank of the current round."""
        return list(range(current().slot.size))

    def size(self) -> int:
        """Number of processes in the set (the round's size)."""
        return current().slot.size

    def rank(self) -> int:
        """This process's rank in the set (its rank in the round)."""
        return current().slot.rank

    def included(self) -> bool:
        """Whether this process belongs to the set: always."""
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProcessSet)

    def __hash__(self) -> int:
        return hash(ProcessSet)

    def __repr__(self) -> str:
        return "ProcessSet(global)"


global_process_set = ProcessSet([])
"""The set of every process of the current round, the default of every collective."""


def check_process_set(process_set: ProcessSet) -> None:
    """Refuse anything but the global process set."""
    if not isinstance(process_set, ProcessSet):
        raise NotImplementedError(
            f"process_set={process_set!r}: elasticjob supports only hvd.global_process_set"
        )


def add_process_set(process_set: ProcessSet | Iterable[int]) -> ProcessSet:
    """Register a process set: accepted only for the global set (see :class:`ProcessSet`),
    which is returned."""
    if isinstance(process_set, ProcessSet):
        return process_set
    return ProcessSet(process_set)


def remove_process_set(process_set: ProcessSet) -> bool:
    """Horovod's ``remove_process_set``: the global set cannot be removed (returns False)."""
    check_process_set(process_set)
    return False
