"""Horovod's process sets: collectives among a subset of the round's ranks.

A :class:`ProcessSet` lists global ranks. It is registered in the current round by
``hvd.init(process_sets=[...])`` or :func:`add_process_set`, both collective: every rank of
the round makes the same calls in the same order, as Horovod requires. Registering forms the
set's own group and negotiation (``negotiation.py``): its members match their collectives by
name among themselves, beside the other sets and the global one. Only members call a set's
collectives; ``root_rank`` stays a global rank, as in Horovod, while :meth:`ProcessSet.rank`
is the rank within the set (the order of an allgather's result).

Ranks mean processes only within a round. When a new round forms (a member failed, the job
was resized, or ``init()`` after ``shutdown()``), every set but :data:`global_process_set` is
invalidated (its ``process_set_id`` becomes None) and a collective given it raises
ValueError; an elastic script registers its sets for each new world at the top of the
function ``elastic.run`` wraps, or in a reset callback (both run on every member of the new
round once its group exists).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from elasticjob.worker_runtime import basics
from elasticjob.worker_runtime.basics import current
from elasticjob.worker_runtime.collectives.negotiation import Negotiation


class ProcessSet:
    """A set of global ranks that run collectives together (Horovod's ``hvd.ProcessSet``).
    ``process_set_id`` is set while it is registered in the current round (0: the global
    set), None otherwise."""

    def __init__(self, ranks_or_comm: Iterable[int]) -> None:
        if isinstance(ranks_or_comm, str | bytes) or not isinstance(ranks_or_comm, Iterable):
            raise NotImplementedError(
                "ProcessSet from an MPI communicator: elasticjob has no MPI; build it from a "
                "list of ranks"
            )
        ranks = sorted(ranks_or_comm)
        if any(not isinstance(r, int) or isinstance(r, bool) for r in ranks):
            raise ValueError("ProcessSet should be initialized with a list of process ranks")
        self._ranks = ranks
        self._id: int | None = None
        self._generation = -1

    @property
    def ranks(self) -> list[int]:
        """The set's global ranks, in order."""
        return list(self._ranks)

    @property
    def process_set_id(self) -> int | None:
        """The set's id in the current round (None: not registered in it)."""
        if self._id is None or self._generation != current().group.generation:
            return None
        return self._id

    def _invalidate(self) -> None:
        self._id = None

    def size(self) -> int | None:
        """The number of processes in the set (None: not registered)."""
        return None if self.process_set_id is None else len(self.ranks)

    def rank(self) -> int | None:
        """This process's rank within the set (None: not registered); raises ValueError on
        a process outside it. Collectives take global ranks (``root_rank``), not this."""
        if self.process_set_id is None:
            return None
        ranks, mine = self.ranks, current().slot.rank
        if mine not in ranks:
            raise ValueError(f"rank {mine} is not part of {self}")
        return ranks.index(mine)

    def included(self) -> bool | None:
        """Whether this process belongs to the set (None: not registered)."""
        return None if self.process_set_id is None else current().slot.rank in self.ranks

    def __str__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"

    __repr__ = __str__


class _GlobalProcessSet(ProcessSet):
    """Every rank of the current round, whatever its size: always registered, id 0."""

    def __init__(self) -> None:
        super().__init__([])
        self._id = 0

    @property
    def ranks(self) -> list[int]:
        return list(range(current().slot.size))

    @property
    def process_set_id(self) -> int | None:
        return 0

    def _invalidate(self) -> None:
        """The global set stays."""


global_process_set: ProcessSet = _GlobalProcessSet()
"""The set of every process of the current round, the default of every collective."""


@dataclass
class _Registry:
    """The sets registered in one round (one formed group)."""

    generation: int
    sets: dict[int, tuple[tuple[int, ...], Negotiation | None]] = field(default_factory=dict)
    next_id: int = 1


_registry: _Registry | None = None


def _current_registry() -> _Registry:
    global _registry
    generation = current().group.generation
    if _registry is None or _registry.generation != generation:
        _registry = _Registry(generation)
    return _registry


def negotiation_of(process_set: ProcessSet) -> Negotiation:
    """The negotiation the collectives of ``process_set`` go through on this rank; raises
    ValueError for a set not registered in this round, or one this rank is not part of."""
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"process_set={process_set!r} is not a ProcessSet")
    set_id = process_set.process_set_id
    if set_id == 0:
        return current().group.negotiation
    if set_id is None:
        raise ValueError(
            f"{process_set} is not registered in this round: register it with "
            "hvd.add_process_set() (after a reset, again in a reset callback: a new round "
            "voids every set but the global one)"
        )
    _, negotiation = _current_registry().sets[set_id]
    if negotiation is None:
        raise ValueError(
            f"rank {current().slot.rank} called a collective of {process_set}, which it is "
            "not part of"
        )
    return negotiation


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a process set in the current round and return it (a collective: every rank
    of the round calls it with the same ranks, in the same order). A set of the same ranks
    already registered raises ValueError, as in Horovod."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    ranks = tuple(process_set.ranks)
    size = current().slot.size
    registry = _current_registry()
    if not ranks or any(r < 0 or r >= size for r in ranks) or len(set(ranks)) != len(ranks):
        raise ValueError(
            f"{process_set}: a process set lists distinct ranks of the round (0..{size - 1})"
        )
    if ranks == tuple(range(size)) or any(ranks == known for known, _ in registry.sets.values()):
        raise ValueError(f"Attempted to add a duplicate process set: {process_set}")
    set_id = registry.next_id
    registry.next_id += 1
    negotiation = current().group.subset_negotiation(ranks, f"set-{set_id}")
    registry.sets[set_id] = (ranks, negotiation)
    process_set._id, process_set._generation = set_id, registry.generation
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister ``process_set`` (every rank calls it); False for the global set or a set
    not registered in this round."""
    set_id = process_set.process_set_id
    if set_id is None or set_id == 0:
        return False
    _, negotiation = _current_registry().sets.pop(set_id)
    if negotiation is not None:
        negotiation.close()
    process_set._invalidate()
    return True


def init(comm: object = None, process_sets: Sequence[ProcessSet] | str | None = None) -> None:
    """Horovod's ``hvd.init(comm=None, process_sets=None)``: start the worker runtime and join
    the job's first round (:func:`elasticjob.worker_runtime.basics.init`), then register
    ``process_sets`` in it (a list of :class:`ProcessSet`, registered in order; ``"dynamic"``,
    Horovod's switch for :func:`add_process_set`, needs nothing here)."""
    if comm is not None:
        raise NotImplementedError(
            "hvd.init(comm=...): elasticjob has no MPI communicators; every process of the "
            "round is in the world (use process sets for subsets)"
        )
    if isinstance(process_sets, str) and process_sets != "dynamic":
        raise ValueError(f'process_sets={process_sets!r}: give a list of sets, or "dynamic"')
    basics.init()
    if process_sets is None or isinstance(process_sets, str):
        return
    for process_set in process_sets:
        if process_set.process_set_id is None:
            add_process_set(process_set)
