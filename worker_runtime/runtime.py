"""The per-process worker runtime: rounds and the process group of each.

One :class:`Runtime` lives in each worker process (created by ``init()``). It

- hosts a TCPStore server on the worker's bind address, used when this worker is rank 0;
- asks the rendezvous service for each round (rank, size, local and cross ranks, the store
  of the round's rank 0) and forms a fresh process group on a fresh store prefix;
- follows the job's notices on a background thread: hosts added or removed feed the
  agreement of ``host_updates.py`` that ``check_host_updates()`` consults, and a failed
  member of the current round aborts the group at once;
- beats a heartbeat on another background thread (``heartbeat.py``), so the driver can tell
  a frozen process from a slow step, and so the process exits once the rendezvous service
  has been unreachable for the orphan timeout (its launcher or operator is gone);
- while a collective or the forming of a group has blocked for ``probe_after_s``, probes the
  peers its round gave it (``reachability.py``) and reports the unreachable ones with each
  beat, so the driver evicts a member cut off from its peers (``probes.py`` of the
  rendezvous says whom each member probes).
- tells the driver how its process ends, and on rank 0 the training's progress from a third
  background thread (``reports.py``): the training loop never waits on the rendezvous
  service for it.

Its configuration comes from the environment (``config.py``). Without the launcher's
environment it runs standalone as a world of one.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import threading
import time

import torch
from torch.distributed import HashStore, Store, TCPStore

from elasticjob.wire.messages import (
    Notice,
    NoticeKind,
    RendezvousRequest,
    RendezvousStatus,
    SlotInfo,
)
from elasticjob.worker_contract import ENV_CUDA_VISIBLE_DEVICES, WorkerConfig
from elasticjob.worker_runtime import timeline
from elasticjob.worker_runtime.devices import device_for_slot, resolve_backend
from elasticjob.worker_runtime.exceptions import HorovodInternalError, WorkerRemoved
from elasticjob.worker_runtime.formation import await_members, connect_store
from elasticjob.worker_runtime.heartbeat import Heartbeat
from elasticjob.worker_runtime.host_updates import HostUpdateAgreement
from elasticjob.worker_runtime.interfaces import pin_socket_interfaces
from elasticjob.worker_runtime.log import CONTEXT, get_logger
from elasticjob.worker_runtime.notices import NoticeWatcher
from elasticjob.worker_runtime.placement import export_script_env, tentative_place
from elasticjob.worker_runtime.process_group import RoundGroup
from elasticjob.worker_runtime.reachability import PROBE_TIMEOUT_S, PeerProber, ProbeListener
from elasticjob.worker_runtime.rendezvous_client import RendezvousClient
from elasticjob.worker_runtime.reports import Reports

logger = get_logger(__name__)

_RENDEZVOUS_POLL_S = 20.0
ORPHANED_EXIT_CODE = 1
"""The exit status of a worker that ends because its rendezvous stayed unreachable."""


class Runtime:
    """The worker's view of the job (see the module docstring)."""

    def __init__(self, config: WorkerConfig | None) -> None:
        self.config = config
        local_rank = config.local_rank if config else 0
        self.backend = resolve_backend(config.backend if config else "auto")
        self.device = self._set_device(local_rank)
        if config is not None:
            # Before any group exists: Gloo and NCCL read these when they create one.
            pinned = pin_socket_interfaces(config.bind_address)
            if pinned:
                logger.info(
                    "sockets of Gloo and NCCL on the interface of %s: %s",
                    config.bind_address,
                    " ".join(f"{name}={value}" for name, value in sorted(pinned.items())),
                )
        self.group = RoundGroup(self.backend, self.device)
        hostname = config.hostname if config else "localhost"
        self.slot = SlotInfo(
            hostname=hostname,
            rank=0,
            local_rank=local_rank,
            cross_rank=0,
            size=1,
            local_size=1,
            cross_size=1,
        )
        self.round = 0
        self._step = 0
        self.sync_required = True
        self._join_deferred = False
        self._tentative: tuple[int, SlotInfo] | None = None
        self._termination_requested = False
        self.exit_code: int | None = None
        """The status the process will exit with, once the elastic loop knows it."""
        self._lock = threading.Lock()
        self._host_updates = HostUpdateAgreement()
        self._max_failed_round = 0
        self._client: RendezvousClient | None = None
        self._watcher: NoticeWatcher | None = None
        self._heartbeat: Heartbeat | None = None
        self._prober: PeerProber | None = None
        self._probe_listener: ProbeListener | None = None
        self._store: Store | None = None
        # The round's store client: held for as long as the round's group uses it.
        self._round_store: Store | None = None
        CONTEXT.job = config.job if config else "standalone"
        self.reports = Reports(None, hostname, local_rank, self._position)
        """What this worker tells the driver: its result and rank 0's progress."""
        if config is None:
            return
        timeout = datetime.timedelta(seconds=config.collective_timeout_s)
        server = TCPStore(
            config.bind_address, 0, is_master=True, wait_for_workers=False, timeout=timeout
        )
        self._store, self._store_port = server, server.port
        self._probe_listener = ProbeListener()
        self._client = RendezvousClient(
            config.rendezvous_url, config.job, config.token, ca_pem=config.rendezvous_ca
        )
        self._watcher = NoticeWatcher(self._client, self._on_notice)
        self.reports = Reports(self._client, hostname, local_rank, self._position)
        if config.heartbeat_interval_s > 0 or config.orphan_timeout_s > 0:
            # Without a heartbeat the driver asked for, beat only to notice being orphaned.
            interval = config.heartbeat_interval_s or config.orphan_timeout_s / 4
            # Probe reports are for a driver that evicts, that is one that asked for beats.
            probe_after = config.probe_after_s if config.heartbeat_interval_s > 0 else 0.0
            self._prober = PeerProber(
                self.group.blocked_for, probe_after, min(PROBE_TIMEOUT_S, interval)
            )
            self._heartbeat = Heartbeat(
                self._client,
                config.hostname,
                config.local_rank,
                interval,
                orphan_timeout_s=config.orphan_timeout_s,
                on_orphaned=self._on_orphaned,
                probe=self._prober.probe,
            )

    def _set_device(self, local_rank: int) -> torch.device:
        """This slot's device (``devices.py``), made current under NCCL."""
        plan = device_for_slot(
            local_rank,
            self.backend,
            torch.cuda.device_count() if self.backend == "nccl" else 0,
            os.environ.get(ENV_CUDA_VISIBLE_DEVICES),
        )
        if plan.cuda_index is not None:
            torch.cuda.set_device(plan.cuda_index)
            logger.info(
                "slot %d uses %s%s",
                local_rank,
                plan.device,
                f" ({ENV_CUDA_VISIBLE_DEVICES} entry {plan.physical})"
                if plan.physical is not None
                else "",
            )
        return plan.device

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Join the first round; or, for a worker added to a running job, form a provisional
        world of one and defer joining to :meth:`join_deferred` (called by ``elastic.run``),
        so that the members keep training while this process builds its model."""
        if self._watcher is None:
            self.round = 1
            self._form_world_of_one("standalone/")
            self.sync_required = False
            return
        self._watcher.start()
        if self._heartbeat is not None:
            self._heartbeat.start()
        self._defer_termination()
        assert self._client is not None and self.config is not None
        info = self._client.round_info()
        if info.round > 0:
            logger.info("joining a running job: deferred until the training loop starts")
            self._join_deferred = True
            self._form_world_of_one("provisional/")
            self._tentative = tentative_place(self._client, self.config, info)
            export_script_env(self.visible[1], self.config.job, None)
            return
        self.sync_required = self._join()

    def _defer_termination(self) -> None:
        """Under the operator, a pod being deleted or preempted gets SIGTERM while the driver
        tells the job the pod leaves: keep training until this worker is released at the
        next host-update check (no rollback for anyone). A second SIGTERM, or one outside a
        round, ends the process at once."""
        if self.config is None or not self.config.defer_sigterm:
            return
        if threading.current_thread() is not threading.main_thread():
            return

        def on_sigterm(signum: int, _frame: object) -> None:
            if self._termination_requested or self.round == 0:
                raise SystemExit(128 + signum)
            self._termination_requested = True
            logger.warning("SIGTERM: leaving at the next host-update check (again: exit now)")

        signal.signal(signal.SIGTERM, on_sigterm)

    def _on_orphaned(self, silent_s: float) -> None:
        """The rendezvous service has been unreachable for the orphan timeout: nobody is left
        to run this job; end the process at once (on the heartbeat thread)."""
        logger.error(
            "the rendezvous service has been unreachable for %.0f s: the launcher or operator "
            "is gone; exiting",
            silent_s,
        )
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(ORPHANED_EXIT_CODE)

    def join_deferred(self) -> bool:
        """Join the job now if :meth:`start` deferred it; return whether it did."""
        if not self._join_deferred:
            return False
        self._join_deferred = False
        self.group.destroy()
        self._tentative = None
        self.sync_required = self._join()
        return True

    def reset(self, *, rolled_back: bool = False) -> bool:
        """Leave the current round and join the next; return whether state must be synced.
        ``rolled_back``: this worker rolled its state back after a collective failed (the
        driver is told, so that the next round syncs every rank from rank 0).

        Raises :class:`WorkerRemoved` when this worker is no longer part of the job."""
        started, left = timeline.now(), self.round
        if rolled_back and self._prober is not None and self._heartbeat is not None:
            self._prober.collective_failed(self.round)
            self._heartbeat.beat_now()
        self.group.destroy()
        if self._watcher is None:
            self.round += 1
            self._form_world_of_one(f"standalone-{self.round}/")
            return False
        self.sync_required = self._join(rolled_back=rolled_back)
        timeline.span("reset", started, left=left, joined=self.round, rolled_back=rolled_back)
        return self.sync_required

    def _form_world_of_one(self, prefix: str) -> None:
        self.group.configure(HashStore(), prefix, 0, 1, datetime.timedelta(seconds=60))

    def shutdown(self) -> None:
        """Destroy the group and stop following notices."""
        timeline.instant("shutdown", round=self.round)
        timeline.flush()
        self.group.destroy()
        if self._probe_listener is not None:
            self._probe_listener.close()
        if self._watcher is not None:
            self._watcher.stop()
        self.reports.stop()

    @property
    def visible(self) -> tuple[int, SlotInfo]:
        """The round and slot that ``rank()``, ``size()``... and the script variables give: the
        current ones, or while the join is deferred (:meth:`start`) the tentative ones (the
        group is then a provisional world of one, which :attr:`slot` describes)."""
        return (self.round, self.slot) if self._tentative is None else self._tentative

    @property
    def round_store(self) -> Store | None:
        """The store the current round's group was formed on (None: a world of one)."""
        return self._round_store

    @property
    def step(self) -> int:
        """Optimizer steps taken (synced from rank 0 whenever state is)."""
        return self._step

    @step.setter
    def step(self, value: int) -> None:
        self._step = CONTEXT.step = value

    def _position(self) -> tuple[int, int, int]:
        """This worker's round, rank and step now (what its reports carry)."""
        return self.round, self.slot.rank, self.step

    @property
    def _worker_name(self) -> str:
        return f"{self.slot.hostname}[{self.slot.local_rank}]"

    # ---- rounds ------------------------------------------------------------------------

    def _join(self, *, rolled_back: bool = False) -> bool:
        assert self.config is not None and self._client is not None
        started, started_us = time.monotonic(), timeline.now()
        deadline = started + self.config.round_wait_s
        after_round = self.round
        while True:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"no round assigned within {self.config.round_wait_s:.0f} s "
                    f"(job {self.config.job}, worker {self._worker_name})"
                )
            response = self._client.rendezvous(
                RendezvousRequest(
                    hostname=self.config.hostname,
                    local_rank=self.config.local_rank,
                    address=self.config.bind_address,
                    store_port=self._store_port,
                    probe_port=self._probe_listener.port if self._probe_listener else None,
                    after_round=after_round,
                    wait_seconds=_RENDEZVOUS_POLL_S,
                    rolled_back=rolled_back,
                ),
                retry_for_s=max(deadline - time.monotonic(), 1.0),
            )
            if response.status is RendezvousStatus.PENDING:
                continue
            if response.status in (RendezvousStatus.REMOVED, RendezvousStatus.FINISHED):
                self.shutdown()
                self.exit_code = 0
                raise WorkerRemoved(
                    f"worker {self._worker_name} leaves the job: "
                    f"{response.message or response.status.value.lower()}"
                )
            assert response.slot is not None and response.store_address is not None
            assert response.store_port is not None
            after_round = response.round
            with self._lock:
                if response.round <= self._max_failed_round:
                    logger.info(
                        "round %d failed before it formed; waiting for the next", after_round
                    )
                    continue
                self.round = response.round
            if self._prober is not None:
                self._prober.joined_round(response.round, response.peers)
            self._host_updates.joined_round(response.notice_seq)
            self.slot = response.slot
            CONTEXT.round, CONTEXT.rank = self.round, self.slot.rank
            try:
                self._form_group(response.store_address, response.store_port)
            except HorovodInternalError as exc:
                logger.warning("round %d: %s; waiting for the next round", self.round, exc)
                continue
            master = (response.store_address, response.store_port)
            export_script_env(self.visible[1], self.config.job, master)
            logger.info(
                "%s joined round %d in %.3f s as rank %d of %d (local %d/%d, cross %d/%d, sync=%s)",
                self.config.hostname,
                self.round,
                time.monotonic() - started,
                self.slot.rank,
                self.slot.size,
                self.slot.local_rank,
                self.slot.local_size,
                self.slot.cross_rank,
                self.slot.cross_size,
                response.sync,
            )
            rank, size = self.slot.rank, self.slot.size
            timeline.span("join round", started_us, round=self.round, rank=rank, size=size)
            timeline.flush()
            return response.sync

    def _form_group(self, store_address: str, store_port: int) -> None:
        assert self.config is not None
        timeout = datetime.timedelta(seconds=self.config.collective_timeout_s)
        prefix = f"{self.config.job}/round-{self.round}/"
        # Interruptible, unlike init_process_group: a member that cannot come (cut off, dead)
        # fails the round, and the others give up at once (``formation.py``).
        with self.group.blocking():
            if self.slot.rank == 0:
                assert self._store is not None
                store = self._store
            else:
                store = connect_store(store_address, store_port, timeout, self._round_failed)
            self._round_store = store
            await_members(store, prefix, self.slot.size, timeout, self._round_failed)
        self.group.configure(store, prefix, self.slot.rank, self.slot.size, timeout)
        if self._round_failed():
            self.group.abort(f"a member of round {self.round} failed")

    def _round_failed(self) -> bool:
        with self._lock:
            return self.round <= self._max_failed_round

    # ---- notices -----------------------------------------------------------------------

    def _on_notice(self, notice: Notice) -> None:
        if notice.kind is NoticeKind.ROUND_FAILED:
            with self._lock:
                self._max_failed_round = max(self._max_failed_round, notice.round)
                current = self.round
            if notice.round == current:
                logger.info("a member of round %d failed; aborting the group", notice.round)
                self.group.abort(f"a member of round {notice.round} failed (driver notice)")
            return
        self._host_updates.saw_notice(notice.seq)
        logger.info("notice %d: %s %s", notice.seq, notice.kind.value, ",".join(notice.hosts))

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
        has seen a hosts-added or hosts-removed notice (see :class:`HostUpdateAgreement`)."""
        self._host_updates.check(self.group, self.slot.size)

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
        if self._heartbeat is not None and self.reports.end_delivered:
            self._heartbeat.stop()
