"""The per-process worker runtime: the worker's view of the job.

One :class:`Runtime` lives in each worker process (created by ``init()``). It puts together
the concerns of a worker, each in its own module:

- the process's setup and liveness (``worker_process.py``): its device, the interface of its
  sockets, SIGTERM, and a heartbeat thread that shows the driver the process is alive, probes
  the round's peers when a collective blocks, and ends an orphaned process;
- joining rounds (``rounds/runtime_rounds.py``, through the round protocol's joiner,
  ``rounds/joiner.py``): asking the rendezvous service for each round and forming its
  process group (``process_group.py``) on a fresh store prefix;
- the job's notices (``notices.py``), followed on a background thread and classified as every
  worker classifies them (``rounds/notice_causes.py``): a failed member of the current round
  aborts the group at once, and hosts added or removed (or a suspension) feed the agreement
  of ``host_updates.py`` that ``check_host_updates()`` consults;
- what the worker tells the driver (``reports.py``): how its process ends, and on rank 0 the
  training's progress, from another background thread.

Its configuration comes from the environment (``elasticjob/worker_contract.py``). Without
the launcher's environment it runs standalone as a world of one: the same parts, as null objects (no
service to ask, no notices, no heartbeat, no reports).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
from torch.distributed import Store

from elasticjob.wire.messages import HeldShards, Notice, SlotInfo
from elasticjob.worker_contract import WorkerConfig, standalone_backend
from elasticjob.worker_runtime.collectives import lingering
from elasticjob.worker_runtime.diagnostics import timeline
from elasticjob.worker_runtime.diagnostics.log import CONTEXT, STANDALONE_JOB, get_logger
from elasticjob.worker_runtime.diagnostics.step_pace import StepPaceMeter
from elasticjob.worker_runtime.exceptions import WorkerRemoved
from elasticjob.worker_runtime.link.notices import NoNotices, Notices, NoticeWatcher
from elasticjob.worker_runtime.link.rendezvous_client import RendezvousClient
from elasticjob.worker_runtime.link.reports import DriverReports, NoReports, Reports
from elasticjob.worker_runtime.rounds.devices import resolve_backend
from elasticjob.worker_runtime.rounds.host_updates import HostUpdateAgreement
from elasticjob.worker_runtime.rounds.notice_causes import NoticeCause, classify_notice
from elasticjob.worker_runtime.rounds.process_group import RoundGroup
from elasticjob.worker_runtime.rounds.runtime_rounds import (
    RendezvousRounds,
    Rounds,
    StandaloneRounds,
)
from elasticjob.worker_runtime.worker_process import (
    Liveness,
    NoHeartbeat,
    defer_sigterm,
    liveness_for,
    pin_interfaces,
    use_device,
)

logger = get_logger(__name__)

_T = TypeVar("_T")


class Runtime:
    """The worker's view of the job (see the module docstring); ``config`` None: standalone."""

    def __init__(self, config: WorkerConfig | None) -> None:
        self.config = config
        """The worker's contract (None: standalone)."""
        self._step = 0
        self.exit_code: int | None = None
        """The status the process will exit with, once the elastic loop knows it."""
        self.settled = True
        """Whether every lingering thread (``lingering``) had ended by the last shutdown."""
        self._host_updates = HostUpdateAgreement()
        self.device: torch.device
        """The device collectives run on."""
        self.group: RoundGroup
        """The current round's process group."""
        self.reports: Reports
        """What this worker tells the driver: its result and rank 0's progress."""
        self.node: str
        """The machine this worker runs on, which fails as one (a pod: its node): where a
        copy must not be kept to survive this worker's failure."""
        self._rounds: Rounds
        self._notices: Notices
        self._liveness: Liveness
        if config is None:
            self._standalone()
        else:
            self._launched(config)

    def _standalone(self) -> None:
        CONTEXT.job = STANDALONE_JOB
        backend = resolve_backend(standalone_backend())
        self.device = use_device(0, backend)
        self.group = RoundGroup(backend, self.device)
        self._pace = StepPaceMeter(self.group.blocked_total)
        self._rounds = StandaloneRounds(self.group)
        self.node = self._rounds.slot.hostname
        self._notices = NoNotices()
        self._liveness = NoHeartbeat()
        self.reports = NoReports()

    def _launched(self, config: WorkerConfig) -> None:
        CONTEXT.job = config.job
        backend = resolve_backend(config.backend)
        self.device = use_device(config.local_rank, backend)
        pin_interfaces(config.bind_address)
        self.node = config.node
        self.group = RoundGroup(backend, self.device)
        self._pace = StepPaceMeter(self.group.blocked_total)
        client = RendezvousClient.for_worker(config)
        self._liveness = liveness_for(
            config,
            client,
            self.group.blocked_for,
            self._pace.pace,
            self._held_shards,
        )
        rounds = RendezvousRounds(config, client, self.group, self._liveness, self._host_updates)
        self._rounds = rounds
        self._notices = NoticeWatcher(client, _notice_handler(rounds, self._host_updates))
        self.reports = DriverReports(client, config.hostname, config.local_rank, self._position)
        if config.defer_sigterm:
            defer_sigterm(lambda: self.round > 0)

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Join the first round; or, for a worker added to a running job, form a provisional
        world of one and defer joining to :meth:`join_deferred` (called by ``elastic.run``),
        so that the members keep training while this process builds its model."""
        self._notices.start()
        self._liveness.start()
        self._leaving_if_removed(self._rounds.start)

    def join_deferred(self) -> bool:
        """Join the job now if :meth:`start` deferred it; return whether it did."""
        return self._leaving_if_removed(self._rounds.join_deferred)

    def reset(self, *, rolled_back: bool = False, suspended: bool = False) -> bool:
        """Leave the current round and join the next; return whether state must be synced.
        ``rolled_back``: this worker rolled its state back after a collective failed (the
        driver is told, so that the next round syncs every rank from rank 0); ``suspended``:
        it saved its state for a suspension (the driver then ends the job's run).

        Raises :class:`WorkerRemoved` when this worker is no longer part of the job."""
        self._leaving_if_removed(
            lambda: self._rounds.next(rolled_back=rolled_back, suspended=suspended)
        )
        return self._rounds.sync_required

    def tell_held_shards(self, source: Callable[[], HeldShards | None]) -> None:
        """Have each later request for a round, and each heartbeat, say what ``source()``
        returns then: what this worker holds of a sharded state's last confirmed commit (that state
        calls it), by which the driver places the next round's ranks and plans what follows
        a lost slot (``elasticjob.driver.rank_placement`` and ``slot_loss``)."""
        self._rounds.held_shards = source

    def _held_shards(self) -> HeldShards | None:
        """What the source told to :meth:`tell_held_shards` returns now (a heartbeat's)."""
        return self._rounds.held_shards()

    def held_shards_changed(self) -> None:
        """What the source told to :meth:`tell_held_shards` returns changed: the driver hears
        it with a heartbeat sent at once."""
        self._liveness.beat_now()

    def _leaving_if_removed(self, join: Callable[[], _T]) -> _T:
        """Run ``join``; when it finds this worker removed from the job, shut down and set
        the exit status 0 before :class:`WorkerRemoved` goes on."""
        try:
            return join()
        except WorkerRemoved:
            self.shutdown()
            self.exit_code = 0
            raise

    def suspend(self) -> None:
        """Destroy the round's group, staying a worker of the job (``shutdown()`` in a
        script: :meth:`resume` forms the group again)."""
        timeline.instant("shutdown", round=self.round)
        self.group.destroy()
        self.settled = lingering.settle(lingering.SETTLE_S)

    def resume(self) -> None:
        """Form the round's group again after :meth:`suspend` (``init()`` again: every member
        of the round must call it, as with Horovod)."""
        self._leaving_if_removed(self._rounds.reform)

    def shutdown(self) -> None:
        """Destroy the group and stop following notices. Waits for lingering threads, unless
        an earlier wait ran out already (a removed worker shuts down twice: when it learns
        it, and at exit)."""
        timeline.instant("shutdown", round=self.round)
        timeline.flush()
        self.group.destroy()
        self.settled = lingering.settle(lingering.SETTLE_S if self.settled else 0.0)
        self._rounds.close()
        self._notices.stop()
        self.reports.stop()

    # ---- where the worker is -----------------------------------------------------------

    @property
    def round(self) -> int:
        """The number of the round this worker is in (0: none yet)."""
        return self._rounds.round

    @property
    def slot(self) -> SlotInfo:
        """This worker's slot in the current round (or its provisional world of one)."""
        return self._rounds.slot

    @property
    def sync_required(self) -> bool:
        """Whether entering the current round requires state to be synced from rank 0."""
        return self._rounds.sync_required

    @property
    def visible(self) -> tuple[int, SlotInfo]:
        """The round and slot that ``rank()``, ``size()``... and the script variables give: the
        current ones, or while the join is deferred (:meth:`start`) the tentative ones (the
        group is then a provisional world of one, which :attr:`slot` describes)."""
        return self._rounds.visible

    @property
    def round_store(self) -> Store | None:
        """The store the current round's group was formed on (None: a world of one)."""
        return self._rounds.store

    @property
    def step(self) -> int:
        """Optimizer steps taken (synced from rank 0 whenever state is)."""
        return self._step

    @step.setter
    def step(self, value: int) -> None:
        self._step = CONTEXT.step = value

    def count_step(self) -> None:
        """The script took an optimizer step: count it, and time it for the step pace its
        heartbeats carry (``step_pace.py``)."""
        self.step += 1
        self._pace.step_done(self.round)

    def _position(self) -> tuple[int, int, int]:
        """This worker's round, rank and step now (what its reports carry)."""
        return self.round, self.slot.rank, self.step

    # ---- host updates ------------------------------------------------------------------

    def host_update_vote(self) -> int:
        """This rank's view of host updates (see :meth:`HostUpdateAgreement.vote`)."""
        return self._host_updates.vote()

    def host_update_pending(self) -> bool:
        """Whether this rank has seen a hosts-added or hosts-removed notice that the next
        :meth:`check_host_updates` will act on."""
        return self._host_updates.pending()

    def settle_host_update_vote(self, mean: float) -> None:
        """Record the mean of every rank's :meth:`host_update_vote`, reduced along with a
        collective the ranks made anyway (DistributedOptimizer's gradient allreduce); the
        next :meth:`check_host_updates` uses it instead of a collective of its own."""
        self._host_updates.settle(mean)

    def check_host_updates(self) -> None:
        """Raise :class:`HostsUpdatedInterrupt` on every rank at the same step once any rank
        has seen a hosts-added, hosts-removed or suspend notice (see
        :class:`HostUpdateAgreement`)."""
        self._host_updates.check(self.group, self.slot.size)

    def suspend_agreed(self) -> bool:
        """Once :meth:`check_host_updates` raised: whether the job is being suspended (a
        collective of the round, which every rank calls)."""
        return self._host_updates.suspend_agreed(self.group)

    # ---- leaving -----------------------------------------------------------------------

    def report_leaving(self) -> None:
        """At interpreter exit: when the elastic loop did not say how the process ends (a
        script without ``elastic.run``, or one that ends outside it), tell the driver now, so
        that it awaits the process's exit rather than its heartbeat (torch's teardown can
        outlast the heartbeat timeout on a loaded machine); an uncaught exception
        (``sys.last_value``) is reported as the failure, and the exit status decides either
        way. Once the driver has the result, stop beating: it gives the teardown its removal
        grace from the last beat, then stops a process whose teardown hangs. Without the
        result it still awaits beats, so they go on."""
        if self.exit_code is None:
            self.reports.exit_status()
        if self.reports.end_delivered:
            self._liveness.stop()


def _notice_handler(
    rounds: RendezvousRounds, host_updates: HostUpdateAgreement
) -> Callable[[Notice], None]:
    """What the job's notices tell their owners (called on the notice thread): a failed
    round goes to ``rounds``, hosts added or removed and a suspension to ``host_updates``."""

    def on_notice(notice: Notice) -> None:
        cause = classify_notice(notice)
        if cause is NoticeCause.FAILURE:
            rounds.round_failed(notice.round)
            return
        host_updates.saw_notice(notice.seq, suspend=cause is NoticeCause.SUSPEND)
        logger.info("notice %d: %s %s", notice.seq, notice.kind.value, ",".join(notice.hosts))

    return on_notice
