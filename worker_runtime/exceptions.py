"""Exceptions that drive the elastic ``run`` loop."""

from __future__ import annotations


class HorovodInternalError(RuntimeError):
    """A collective failed: a peer died, the group was aborted because the driver saw a member
    fail, or the operation timed out. ``elastic.run`` rolls state back to the last commit,
    re-forms the group and retries. (Named as in Horovod so scripts written for it keep
    working; :data:`CollectiveError` is the same class.)"""


CollectiveError = HorovodInternalError


class HostsUpdatedInterrupt(RuntimeError):
    """Every rank agreed that hosts were added or will be removed. ``elastic.run`` keeps the
    live state (no rollback), re-forms the group and resumes.

    ``skip_sync`` is kept for signature compatibility with Horovod; whether state is re-synced
    after the reset is decided by the driver for the whole round, never per rank."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


class WorkerRemoved(SystemExit):
    """This worker is not part of the job any more (scale-in, preemption, or its host was
    blacklisted). Raised from a reset; the process exits 0, which the driver does not count
    as a failure."""

    def __init__(self, reason: str) -> None:
        super().__init__(0)
        self.reason = reason

    def __str__(self) -> str:
        return self.reason


class CollectiveMismatchError(RuntimeError):
    """The ranks called a collective of one name with calls that cannot go together
    (different operations, data types, shapes, reduction operations, roots or scale factors).
    Raised on every rank before any data moves: the group stays usable, and ``elastic.run``
    does not roll back for it (it is the script's error, not a peer's failure)."""
