"""What the restart mode's agents of one start tell each other, through the store rank 0's
agent serves for that start (the one the scripts' ``init_process_group`` joins; these keys are
under ``elasticjob/``, apart from torch's).

Each agent has a wake-up key of its own, waited on by a thread of its own with a connection
of its own (no polling, and no wait holds up the agent), and the flags say why it was woken:

- **a restart follows**: an agent knows that the round restarts whatever the other scripts
  do (its script was killed by a signal it did not send, or stopped after a member failed),
  so the others stop their scripts at once rather than after the grace in which a script
  may still fail on its own (``restart_decisions.FAILURE_GRACE_S``: it only matters while
  every script may yet fail on its own, which fails the job without a restart);
- **every script ended** (the exit barrier): an agent whose script succeeded counts itself
  in; rank 0's agent keeps the store up until every other agent has (their scripts may still
  be tearing their group down on it), as torchrun's agents wait at an exit barrier.

An agent releases its own wait when its attempt ends. Everything is best effort and bounded:
a store that cannot be reached (rank 0's agent is gone) leaves the agents to the driver's
notices and their deadlines.
"""

from __future__ import annotations

import contextlib
import datetime
import threading
from collections.abc import Callable, Iterator
from typing import Final

import torch.distributed as dist
from torch.distributed import Store

from elasticjob.worker_runtime.diagnostics.log import get_logger
from elasticjob.worker_runtime.rounds.group_formation import connect_store
from elasticjob.worker_runtime.rounds.joiner import Endpoint, round_store

logger = get_logger(__name__)

CONNECT_S: Final = 1.0
"""How long the agent itself tries to reach the store to set a key (its watcher, on a thread
of its own, tries for :data:`WATCH_CONNECT_S`)."""
WATCH_CONNECT_S: Final = 60.0
EXIT_BARRIER_S: Final = 60.0
"""How long rank 0's agent keeps its store up for the other ranks' scripts once its own
script succeeded, and how long another agent tries to count itself in."""
_WATCH = datetime.timedelta(days=30)
"""The longest a watcher waits for its key (a start that outlasts it falls back on the
notices)."""
_PREFIX: Final = "elasticjob/"
_RESTART: Final = _PREFIX + "restart"
_ENDED: Final = _PREFIX + "scripts-ended"
_ALL_ENDED: Final = _PREFIX + "all-scripts-ended"


def _wake_key(rank: int) -> str:
    return f"{_PREFIX}wake/{rank}"


def _set_all(store: Store, keys: list[str]) -> None:
    """Set ``keys`` in one request (``multi_set``, which torch's stubs leave out)."""
    store.multi_set(keys, ["1"] * len(keys))  # type: ignore[attr-defined]


@contextlib.contextmanager
def _best_effort(what: str) -> Iterator[None]:
    """Log and go on when the store cannot be reached or fails."""
    try:
        yield
    except (RuntimeError, dist.DistError) as exc:
        logger.info("the start's store did not take %s: %s", what, exc)


class StartKeys:
    """Rank ``rank`` of ``size``'s side of the keys of the start whose store is served at
    ``master`` (``served``: the store itself, on rank 0's agent); ``on_wake`` is called, on
    the watcher's thread, once another agent woke this one."""

    def __init__(
        self,
        served: Store,
        rank: int,
        size: int,
        master: Endpoint,
        on_wake: Callable[[], None],
    ) -> None:
        self._served = served
        self._rank = rank
        self._size = size
        self._master = master
        self._on_wake = on_wake
        self._setter: Store | None = None
        self._closed = threading.Event()
        self._watching = threading.Event()
        """The watcher reached the store and waits on it."""
        self.restart_follows = False
        """Another agent said that a restart follows (read after a wake)."""
        self.all_ended = False
        """Every other agent's script ended after succeeding (rank 0's; read after a
        wake)."""
        threading.Thread(target=self._watch, name="start-keys", daemon=True).start()

    def announce_restart(self) -> None:
        """Tell every agent of the start that a restart follows (this one's wait ends too)."""
        keys = [_RESTART, *(_wake_key(rank) for rank in range(self._size))]
        with _best_effort("the restart"):
            _set_all(self._store(CONNECT_S), keys)

    def script_succeeded(self) -> None:
        """Count this agent's script in at the exit barrier (rank 0's agent waits there
        instead, until :attr:`all_ended`)."""
        if self._rank == 0:
            return
        with _best_effort("the end of the script"):
            store = self._store(EXIT_BARRIER_S)
            if store.add(_ENDED, 1) == self._size - 1:
                _set_all(store, [_ALL_ENDED, _wake_key(0)])

    def close(self) -> None:
        """The attempt ended: release this agent's wait (once it reached the store; one
        still connecting gives up)."""
        self._closed.set()
        if self._watching.is_set():
            with _best_effort("the end of the wait"):
                self._store(CONNECT_S).set(_wake_key(self._rank), "1")

    def _store(self, timeout_s: float) -> Store:
        """The agent's own client of the start's store (rank 0's: the store itself),
        connected within ``timeout_s`` the first time."""
        if self._setter is None:
            timeout = datetime.timedelta(seconds=timeout_s)
            self._setter = round_store(self._served, self._rank, self._master, timeout)
        return self._setter

    def _watch(self) -> None:
        timeout = datetime.timedelta(seconds=WATCH_CONNECT_S)
        try:
            store = connect_store(*self._master, timeout, self._closed.is_set)
            self._watching.set()
            store.wait([_wake_key(self._rank)], _WATCH)
            self.restart_follows = store.check([_RESTART])
            self.all_ended = store.check([_ALL_ENDED])
        except (RuntimeError, dist.DistError) as exc:
            logger.debug("no wake-up from the start's store: %s", exc)
            return
        finally:
            self._watching.clear()
        if not self._closed.is_set():
            self._on_wake()
