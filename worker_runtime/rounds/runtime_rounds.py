"""The rounds of a training process: the round a worker trains in, its slot, and the round's
process group.

A worker started by a launcher asks the job's rendezvous service for each round
(:class:`RendezvousRounds`, through the round protocol's joiner, ``joiner.py``): its rank,
size, local and cross ranks, and the store of the round's rank 0, whose TCPStore server every
worker hosts on its bind address. It forms a fresh process group on a fresh store prefix
(``<job>/round-<n>/``), after every member has arrived at the round's store
(``group_formation.py``), so that a member that cannot come fails the round within seconds
rather than at the collective timeout. A round the driver announced as failed
(:meth:`RendezvousRounds.round_failed`, from the notice thread) aborts its group, and one that
failed before it formed is skipped. A worker added to a running job starts in a provisional
world of one with its tentative place and joins when the training loop starts.

A script run without a launcher (:class:`StandaloneRounds`) trains in a world of one each
round, with nothing to ask and nothing to sync.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable
from typing import Protocol

from torch.distributed import HashStore, Store

from elasticjob.wire.messages import HeldShards, SlotInfo
from elasticjob.worker_contract import WorkerConfig
from elasticjob.worker_runtime.diagnostics import timeline
from elasticjob.worker_runtime.diagnostics.log import CONTEXT, get_logger
from elasticjob.worker_runtime.exceptions import HorovodInternalError
from elasticjob.worker_runtime.link.reachability import ProbeListener
from elasticjob.worker_runtime.link.rendezvous_client import RendezvousClient
from elasticjob.worker_runtime.rounds.group_formation import await_members
from elasticjob.worker_runtime.rounds.host_updates import HostUpdateAgreement
from elasticjob.worker_runtime.rounds.joiner import Endpoint, Joiner, round_store, serve_store
from elasticjob.worker_runtime.rounds.placement import export_script_env, tentative_place
from elasticjob.worker_runtime.rounds.process_group import RoundGroup
from elasticjob.worker_runtime.worker_process import Liveness

logger = get_logger(__name__)

_WORLD_OF_ONE_TIMEOUT = datetime.timedelta(seconds=60)


class Rounds(Protocol):
    """How a worker gets its rounds; ``round``, ``slot`` and ``store`` describe the current
    one, ``sync_required`` whether entering it requires state to be synced from rank 0."""

    round: int
    slot: SlotInfo
    store: Store | None
    """The store the current round's group was formed on (None: a world of one)."""
    sync_required: bool
    held_shards: Callable[[], HeldShards | None]
    """What this worker holds of a one-dimensional sharded state, asked for at each request
    for a round (set by that state; nothing by default)."""

    @property
    def visible(self) -> tuple[int, SlotInfo]:
        """The round and slot the script sees: the current ones, or while the join is
        deferred the tentative ones (the group is then a provisional world of one, which
        :attr:`slot` describes)."""

    def start(self) -> None:
        """Join the first round, or for a worker added to a running job defer the join."""

    def join_deferred(self) -> bool:
        """Join now if :meth:`start` deferred it; return whether it did."""

    def next(self, *, rolled_back: bool, suspended: bool = False) -> None:
        """Leave the current round and join the next (``rolled_back``: this worker rolled its
        state back after a collective failed; ``suspended``: it saved its state for a
        suspension). Raises :class:`WorkerRemoved` when this worker is no longer part of the
        job."""

    def reform(self) -> None:
        """Form the current round's group again after it was destroyed (``init()`` after
        ``shutdown()``, on every member, as Horovod re-initializes): the same ranks, on a
        fresh store prefix; the next round instead if the driver announced that the current
        one failed meanwhile."""

    def close(self) -> None:
        """Stop serving what the rounds' peers reach this worker on."""


def _first_slot(hostname: str, local_rank: int) -> SlotInfo:
    return SlotInfo(
        hostname=hostname,
        rank=0,
        local_rank=local_rank,
        cross_rank=0,
        size=1,
        local_size=1,
        cross_size=1,
    )


def _nothing_held() -> HeldShards | None:
    return None


def _form_world_of_one(group: RoundGroup, prefix: str) -> None:
    group.configure(HashStore(), prefix, 0, 1, _WORLD_OF_ONE_TIMEOUT)


class StandaloneRounds(Rounds):
    """The rounds of a script run without a launcher: a world of one each."""

    sync_required = False
    store: Store | None = None

    def __init__(self, group: RoundGroup) -> None:
        self._group = group
        self.held_shards = _nothing_held
        self.round = 0
        self.slot = _first_slot("localhost", 0)

    @property
    def visible(self) -> tuple[int, SlotInfo]:
        return self.round, self.slot

    def start(self) -> None:
        self.round = 1
        _form_world_of_one(self._group, "standalone/")

    def join_deferred(self) -> bool:
        return False

    def next(self, *, rolled_back: bool, suspended: bool = False) -> None:
        self._group.destroy()
        self.round += 1
        _form_world_of_one(self._group, f"standalone-{self.round}/")

    def reform(self) -> None:
        self.next(rolled_back=False)

    def close(self) -> None:
        pass


class RendezvousRounds(Rounds):
    """The rounds the job's rendezvous service assigns (see the module docstring)."""

    def __init__(
        self,
        config: WorkerConfig,
        client: RendezvousClient,
        group: RoundGroup,
        liveness: Liveness,
        host_updates: HostUpdateAgreement,
    ) -> None:
        self._config = config
        self._client = client
        self._group = group
        self._liveness = liveness
        self._host_updates = host_updates
        self._timeout = datetime.timedelta(seconds=config.collective_timeout_s)
        self._server = serve_store(config.bind_address, self._timeout)
        self._probe_listener = ProbeListener()
        self._joiner = Joiner(config, client, self._probe_listener.port)
        self.held_shards = _nothing_held
        self._lock = threading.Lock()
        self._max_failed_round = 0
        self.round = 0
        self.slot = _first_slot(config.hostname, config.local_rank)
        self.store: Store | None = None
        """The round's store client: held for as long as the round's group uses it."""
        self.sync_required = True
        self._tentative: tuple[int, SlotInfo] | None = None
        """The round and slot a worker added to a running job is planned into, while its join
        is deferred (None: not deferred)."""
        self._master: Endpoint | None = None
        """Where the current round's store is served (rank 0's address and port)."""
        self._reforms = 0
        """How many times the current round's group was formed again (``reform``)."""

    @property
    def visible(self) -> tuple[int, SlotInfo]:
        return (self.round, self.slot) if self._tentative is None else self._tentative

    def start(self) -> None:
        """Join the first round; or, for a worker added to a running job, form a provisional
        world of one and defer joining to :meth:`join_deferred` (called by ``elastic.run``),
        so that the members keep training while this process builds its model."""
        info = self._client.round_info()
        if info.round == 0:
            self.sync_required = self._join()
            return
        logger.info("joining a running job: deferred until the training loop starts")
        _form_world_of_one(self._group, "provisional/")
        tentative = tentative_place(self._client, self._config, info)
        export_script_env(tentative[1], self._config.job, None)
        self._tentative = tentative

    def join_deferred(self) -> bool:
        if self._tentative is None:
            return False
        self._tentative = None
        self._group.destroy()
        self.sync_required = self._join()
        return True

    def next(self, *, rolled_back: bool, suspended: bool = False) -> None:
        started, left = timeline.now(), self.round
        if rolled_back:
            self._liveness.collective_failed(self.round)
        self._group.destroy()
        self.sync_required = self._join(rolled_back=rolled_back, suspended=suspended)
        timeline.span("reset", started, left=left, joined=self.round, rolled_back=rolled_back)

    def reform(self) -> None:
        if self._tentative is not None:
            _form_world_of_one(self._group, "provisional/")
            return
        if self._master is None or self._failed():
            self.next(rolled_back=False)
            return
        self._reforms += 1
        logger.info("forming round %d's group again (re-initialized)", self.round)
        try:
            self._form_group(self._master)
        except HorovodInternalError as exc:
            logger.warning("round %d: %s; waiting for the next round", self.round, exc)
            self.next(rolled_back=False)

    def close(self) -> None:
        self._probe_listener.close()

    def round_failed(self, round_number: int) -> None:
        """The driver announced that a member of ``round_number`` failed: abort its group if
        it is the current round's, and never form it later. Thread-safe."""
        with self._lock:
            self._max_failed_round = max(self._max_failed_round, round_number)
            current = self.round
        if round_number == current:
            logger.info("a member of round %d failed; aborting the group", round_number)
            self._group.abort(f"a member of round {round_number} failed (driver notice)")

    def _join(self, *, rolled_back: bool = False, suspended: bool = False) -> bool:
        """Ask for rounds until one forms; return whether state must be synced."""
        config = self._config
        started, started_us = time.monotonic(), timeline.now()
        deadline = self._joiner.deadline()
        after_round = self.round
        while True:
            assignment = self._joiner.join(
                after_round,
                self._server.port,
                deadline=deadline,
                rolled_back=rolled_back,
                suspended=suspended,
                held_shards=self.held_shards(),
            )
            assert assignment is not None  # never stopped
            after_round = assignment.round
            with self._lock:
                if assignment.round <= self._max_failed_round:
                    logger.info(
                        "round %d failed before it formed; waiting for the next", assignment.round
                    )
                    continue
                self.round = assignment.round
            self._reforms = 0
            self._liveness.joined_round(assignment.round, assignment.peers)
            self._host_updates.joined_round(assignment.notice_seq)
            self.slot = assignment.slot
            CONTEXT.round, CONTEXT.rank = self.round, self.slot.rank
            self._master = assignment.master
            try:
                self._form_group(assignment.master)
            except HorovodInternalError as exc:
                logger.warning("round %d: %s; waiting for the next round", self.round, exc)
                continue
            export_script_env(self.slot, config.job, assignment.master)
            logger.info(
                "%s joined round %d in %.3f s as rank %d of %d (local %d/%d, cross %d/%d, sync=%s)",
                config.hostname,
                self.round,
                time.monotonic() - started,
                self.slot.rank,
                self.slot.size,
                self.slot.local_rank,
                self.slot.local_size,
                self.slot.cross_rank,
                self.slot.cross_size,
                assignment.sync,
            )
            rank, size = self.slot.rank, self.slot.size
            timeline.span("join round", started_us, round=self.round, rank=rank, size=size)
            timeline.flush()
            return assignment.sync

    def _form_group(self, master: Endpoint) -> None:
        prefix = f"{self._config.job}/round-{self.round}/"
        if self._reforms:
            prefix += f"reformed-{self._reforms}/"
        # Interruptible, unlike init_process_group: a member that cannot come (cut off, dead)
        # fails the round, and the others give up at once (``group_formation.py``).
        with self._group.blocking():
            store = round_store(self._server, self.slot.rank, master, self._timeout, self._failed)
            self.store = store
            await_members(store, prefix, self.slot.size, self._timeout, self._failed)
        self._group.configure(store, prefix, self.slot.rank, self.slot.size, self._timeout)
        if self._failed():
            self._group.abort(f"a member of round {self.round} failed")

    def _failed(self) -> bool:
        """Whether the driver announced that the current round failed. Thread-safe."""
        with self._lock:
            return self.round <= self._max_failed_round
