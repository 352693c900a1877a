"""The workers a job admitted, one entry each: what each process registered (its store
endpoint for a round), which of its requests the driver was told of, and the result it
reported. A job keeps nothing for a worker its driver did not admit; a new process of the same
worker gets a fresh entry (:meth:`AdmittedWorkers.readmit`). Whether a worker was dismissed is
its driver's to say (``RendezvousListener.is_dismissed``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from elasticjob.rendezvous.limits import ANNOUNCED_ROUNDS_PER_WORKER
from elasticjob.rendezvous.published_rounds import Binding, Endpoint
from elasticjob.rendezvous.rendezvous_types import Refusal, RequestRefused
from elasticjob.wire.messages import WorkerId, WorkerState


@dataclass
class AdmittedWorker:
    """What a job keeps of one admitted worker process."""

    binding: Binding | None = None
    """The endpoint it registered for its latest round (None: none yet)."""
    announced: set[int] = field(default_factory=set)
    """The recent ``after_round`` values its driver was told of."""
    result: WorkerState | None = None
    """The state it reported with its result (None: none yet)."""


class AdmittedWorkers:
    """The entries of a job's admitted workers (see the module docstring)."""

    def __init__(self, job: str) -> None:
        self._job = job
        self._entries: dict[WorkerId, AdmittedWorker] = {}

    def __contains__(self, worker: object) -> bool:
        return worker in self._entries

    def __eq__(self, other: object) -> bool:
        """Equal when they keep the same entries (a job's state compares as a value)."""
        if not isinstance(other, AdmittedWorkers):
            return NotImplemented
        return (self._job, self._entries) == (other._job, other._entries)

    __hash__ = None  # type: ignore[assignment]

    def check(self, worker: WorkerId, *, retryably: bool) -> None:
        """Refuse a worker the driver did not admit, keeping nothing of it: ``retryably``
        (``NOT_ADMITTED_YET``) or for good (``UNKNOWN_WORKER``)."""
        if worker in self._entries:
            return
        if retryably:
            raise RequestRefused(
                Refusal.NOT_ADMITTED_YET,
                f"job {self._job} has not admitted a worker {worker} (yet): retry",
            )
        raise RequestRefused(
            Refusal.UNKNOWN_WORKER, f"job {self._job} has not launched a worker {worker}"
        )

    def readmit(self, workers: Iterable[WorkerId]) -> None:
        """A new process is about to run for each of these workers: a fresh entry each."""
        for worker in workers:
            self._entries[worker] = AdmittedWorker()

    def admit(self, workers: Iterable[WorkerId]) -> None:
        """Admit these workers, keeping the entries of those admitted already."""
        for worker in workers:
            self._entries.setdefault(worker, AdmittedWorker())

    def entry(self, worker: WorkerId) -> AdmittedWorker:
        """The entry of ``worker`` (an empty one, not kept, for a worker not admitted)."""
        return self._entries.get(worker) or AdmittedWorker()

    def endpoints(self) -> dict[WorkerId, Endpoint]:
        """The endpoint each worker registered last."""
        return {w: e.binding.endpoint for w, e in self._entries.items() if e.binding}

    def bind(self, worker: WorkerId, after_round: int, endpoint: Endpoint) -> None:
        """Refuse another endpoint than the worker registered with for the same
        ``after_round`` (changing nothing)."""
        bound = self._entries[worker].binding
        if bound and bound.after_round == after_round and bound.endpoint != endpoint:
            raise RequestRefused(
                Refusal.ENDPOINT_CHANGED,
                f"{worker} registered for the round after {after_round} with store "
                f"{bound.endpoint.address}:{bound.endpoint.store_port}; it cannot change it",
            )

    def register(self, worker: WorkerId, after_round: int, endpoint: Endpoint) -> bool:
        """The worker asks for the round after ``after_round`` at ``endpoint`` (checked by
        :meth:`bind`): keep the endpoint unless the request is a stale retry (an older
        ``after_round``), and return whether the driver is to be told (once per (worker,
        after_round) among its recent ones)."""
        entry = self._entries[worker]
        if entry.binding is None or entry.binding.after_round <= after_round:
            entry.binding = Binding(after_round, endpoint)
        if after_round in entry.announced:
            return False
        entry.announced.add(after_round)
        if len(entry.announced) > ANNOUNCED_ROUNDS_PER_WORKER:
            entry.announced.discard(min(entry.announced))
        return True

    def forget_announced(self, workers: Iterable[WorkerId]) -> None:
        """These workers were dismissed: what they asked is no longer kept."""
        for worker in workers:
            self.entry(worker).announced.clear()

    def report_result(self, worker: WorkerId, state: WorkerState) -> None:
        """Keep the worker's result; a second one is refused (changing nothing)."""
        entry = self._entries[worker]
        if entry.result is not None:
            raise RequestRefused(
                Refusal.RESULT_REPEATED, f"{worker} has already reported its result"
            )
        entry.result = state
