"""The worker processes one driver launched (their records: ``worker_record.py``), and the
moves the driver makes on them: launch, dismiss, stop, and kill or stop those that take too
long. Whether to make a move is decided in ``decisions.py``, ``timeouts.py``,
``liveness.py`` and ``partition.py``."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping

from elasticjob.driver.driver_types import Clock, Departure, WorkerLauncher
from elasticjob.driver.liveness import hung_workers
from elasticjob.driver.partition import ReceivedReport, partitioned_members
from elasticjob.driver.slot_loss import SlotLoss, decide_slot_loss
from elasticjob.driver.timeouts import overdue_dismissals, overdue_endings, slow_starters
from elasticjob.driver.worker_record import WorkerRecord
from elasticjob.rendezvous.rendezvous_types import JobRendezvous, ProbeReport
from elasticjob.wire.messages import HeldShards, SlotInfo, StepPace, WorkerId

logger = logging.getLogger(__name__)


class WorkerProcesses(Mapping[WorkerId, WorkerRecord]):
    """The records of the launched workers (a read-only mapping), and the moves on them."""

    def __init__(self, launcher: WorkerLauncher, rendezvous: JobRendezvous, clock: Clock) -> None:
        self._records: dict[WorkerId, WorkerRecord] = {}
        self._launcher = launcher
        self._rendezvous = rendezvous
        self._clock = clock
        self._slot_restarts: Counter[str] = Counter()
        """How many slots of each host were restarted in place."""

    def __getitem__(self, worker: WorkerId) -> WorkerRecord:
        return self._records[worker]

    def __iter__(self) -> Iterator[WorkerId]:
        return iter(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def adopt(self, workers: Iterable[WorkerId], round_number: int) -> None:
        """Take running members of ``round_number`` (not at the barrier) as launched; they
        count as having beaten now."""
        now = self._clock()
        for worker in workers:
            self._records[worker] = WorkerRecord(
                started_at=now,
                waiting_after=round_number - 1,
                last_round=round_number,
                last_heartbeat=now,
            )

    def gone(self, worker: WorkerId) -> bool:
        """Whether the worker was dismissed or failed."""
        record = self._records.get(worker)
        return record is not None and record.departure in (Departure.DISMISSED, Departure.FAILED)

    def paces(self, members: Iterable[WorkerId]) -> dict[WorkerId, StepPace | None]:
        """The latest pace each of these members reported (None: none yet)."""
        return {w: self._records[w].pace if w in self._records else None for w in members}

    def at_barrier(self, worker: WorkerId) -> bool:
        """Whether the worker's process runs and waits for the round after its last."""
        record = self._records.get(worker)
        return record is not None and record.at_barrier

    def stopped(self, worker: WorkerId) -> bool:
        """Whether the worker stopped training: it waits at the barrier after its round, or
        its process ended (or was never launched)."""
        record = self._records.get(worker)
        return record is None or not record.running or record.at_barrier

    def leaving(self, members: Iterable[WorkerId]) -> frozenset[WorkerId]:
        """Those of these members that are leaving (see ``Departure.LEAVING``)."""
        return frozenset(
            w
            for w in members
            if w in self._records and self._records[w].departure is Departure.LEAVING
        )

    async def launch_missing(self, slots: Mapping[WorkerId, SlotInfo]) -> list[WorkerId]:
        """Start a fresh process for each worker of ``slots`` (the planned round's) that has
        none running, telling it its planned slot; return those that could not be
        started."""
        failed = []
        for worker in [w for w in slots if w not in self._records or not self[w].running]:
            self._records[worker] = WorkerRecord(started_at=self._clock())
            self._rendezvous.readmit([worker])
            try:
                await self._launcher.start(worker, slots[worker])
            except OSError as exc:
                logger.error("could not start worker %s: %s", worker, exc)
                failed.append(worker)
        return failed

    def dismiss(self, workers: Iterable[WorkerId]) -> None:
        """Tell the workers to exit (see ``Departure.DISMISSED``)."""
        workers = list(workers)
        now = self._clock()
        for worker in workers:
            self._records[worker].departure = Departure.DISMISSED
            self._records[worker].dismissed_at = now
        self._rendezvous.dismiss(workers)

    async def stop(self, worker: WorkerId) -> None:
        """Stop the worker's process (SIGTERM, then SIGKILL)."""
        self._records[worker].stop_requested = True
        await self._launcher.stop(worker)

    async def expire_slow_starters(self, start_timeout_s: float) -> tuple[WorkerId, ...]:
        """Stop the newcomers that did not register within ``start_timeout_s``; they count as
        failed (see ``timeouts.slow_starters``). Return them."""
        expired = slow_starters(self, now=self._clock(), start_timeout_s=start_timeout_s)
        for worker in expired:
            logger.error("worker %s did not register within %.0f s", worker, start_timeout_s)
            self._records[worker].departure = Departure.FAILED
            await self.stop(worker)
        return expired

    async def stop_overdue(
        self, grace_s: float, heartbeat_timeout_s: float | None, counts_from: float | None
    ) -> None:
        """Stop the workers on their way out that have not exited after ``grace_s``:
        dismissed ones, and those whose process hangs after reporting how it ends (judged
        as kills are: see ``timeouts.overdue_endings``)."""
        now = self._clock()
        for worker in overdue_dismissals(self, now=now, grace_s=grace_s):
            logger.warning("dismissed worker %s did not exit; stopping it", worker)
            await self.stop(worker)
        endings = overdue_endings(
            self,
            now=now,
            grace_s=grace_s,
            heartbeat_timeout_s=heartbeat_timeout_s,
            counts_from=counts_from,
        )
        for worker in endings:
            reported = self._rendezvous.reported_result(worker)
            logger.warning(
                "worker %s reported %s and has not exited within %.0f s (its teardown hangs): "
                "stopping it",
                worker,
                reported.value if reported else "its end",
                grace_s,
            )
            await self.stop(worker)

    def held_shards(self, workers: Iterable[WorkerId]) -> dict[WorkerId, HeldShards]:
        """What ``workers`` said they hold of a sharded state in their latest requests for a
        round or heartbeats (those that said nothing are left out)."""
        records = ((w, self._records.get(w)) for w in workers)
        return {w: r.held_shards for w, r in records if r is not None and r.held_shards}

    def slot_loss(self, lost: WorkerId, members: Mapping[WorkerId, SlotInfo]) -> SlotLoss:
        """What follows the failure of ``lost``, a process of a host that lives on, in the
        round of ``members`` (``slot_loss.decide_slot_loss``)."""
        ranked = sorted(members, key=lambda w: members[w].rank)
        return decide_slot_loss(
            lost,
            ranked,
            alive={w for w in ranked if w != lost and w in self._records and self[w].running},
            held=self.held_shards(ranked),
            host_restarts=self._slot_restarts[lost.hostname],
        )

    def restart_in_place(self, lost: WorkerId, members: Mapping[WorkerId, SlotInfo]) -> bool:
        """Whether the slot of ``lost``, a failed member whose host lives on, starts again in
        place (the plan of :meth:`slot_loss`, said in the log); if so, its host's restarts
        count one more, and a fresh process is launched with the next round's missing
        workers (a pod's slot supervisor starts it itself)."""
        loss = self.slot_loss(lost, members)
        if loss.restarts:
            self._slot_restarts[lost.hostname] += 1
            logger.warning("worker %s restarts in its slot: %s", lost, loss.reason)
        elif loss.drop_moves is not None or loss.restart_moves is not None:
            logger.info("worker %s's host is dropped: %s", lost, loss.reason)
        return loss.restarts

    def survivors(self, members: Iterable[WorkerId]) -> set[WorkerId]:
        """The members whose processes live on with the round's state: running, neither
        leaving, dismissed nor failed. A fresh process started since on a member's host (or
        slot) is not one: it never held the state."""
        return {
            w
            for w in members
            if w in self._records
            and self._records[w].running
            and self._records[w].departure is None
            and self._records[w].last_round > 0
        }

    def heartbeats(self) -> dict[WorkerId, float | None]:
        """The last heartbeat of each running process whose beat is awaited: not one that
        reported its result or is on its way out."""
        return {
            w: r.last_heartbeat
            for w, r in self._records.items()
            if r.running and not r.ending and r.departure is None
        }

    def beat(
        self,
        worker: WorkerId,
        report: ProbeReport | None,
        pace: StepPace | None,
        held: HeldShards | None = None,
    ) -> bool:
        """Record a heartbeat of the worker's process, the probe report it carried (a beat
        without one clears the previous), its pace (kept until a newer one) and what it holds
        of a sharded state now; return whether the report names a peer."""
        record = self._records.get(worker)
        if record is None or not record.running:
            return False
        now = self._clock()
        record.last_heartbeat = now
        record.heard_from = True
        record.pace = pace or record.pace
        record.held_shards = held
        record.probe_report = (
            None if report is None else ReceivedReport(report.round, report.unreachable, now)
        )
        return report is not None and bool(report.unreachable)

    async def kill_unanswering(
        self,
        timeout_s: float | None,
        slots: Mapping[WorkerId, SlotInfo],
        round_number: int,
        counts_from: float | None,
    ) -> None:
        """Kill the processes their pods saw end, those that stopped beating (their silence
        counted no earlier than ``counts_from``; None: not at all, see
        ``liveness.Reachability``), and the members of the round in force that their peers
        cannot reach. The last two need heartbeats, so both are off without a heartbeat
        timeout (``timeout_s`` None); probe reports older than it no longer count."""
        await self.kill_seen_ended()
        await self.kill_hung(timeout_s, counts_from)
        if timeout_s is not None:
            await self.kill_partitioned(slots, round_number, timeout_s)

    async def kill_seen_ended(self) -> None:
        """Kill the processes their pods saw end (a slot supervisor's report): the launcher
        then ends the pod and reports its end at once, not when the pod's status says so."""
        for worker, record in sorted(self._records.items()):
            if record.exit_seen is not None and record.running and not record.stop_requested:
                await self.kill(worker, f"its pod saw it end with {record.exit_seen}")

    async def kill_hung(self, timeout_s: float | None, counts_from: float | None) -> None:
        """Kill the processes that sent no heartbeat for ``timeout_s`` (see
        ``liveness.py``); each exit is then classified like any other."""
        now = self._clock()
        hung = hung_workers(
            self.heartbeats(), timeout_s=timeout_s, now=now, counts_from=counts_from
        )
        for worker in sorted(hung):
            silent = now - (self._records[worker].last_heartbeat or now)
            logger.error("worker %s sent no heartbeat for %.1f s: killing it", worker, silent)
            await self.kill(worker, f"it sent no heartbeat for {silent:.1f} s")

    async def kill_partitioned(
        self, slots: Mapping[WorkerId, SlotInfo], round_number: int, max_age_s: float
    ) -> None:
        """Kill the members of round ``round_number`` that their peers report unreachable
        (see ``partition.py``), not a process started since on such a member's slot; each
        exit is then classified like any other."""
        awaited = self.heartbeats()
        reports = {
            w: r.probe_report
            for w, r in self._records.items()
            if r.probe_report is not None and w in awaited and not r.stop_requested
        }
        found = partitioned_members(
            reports, slots, round_number=round_number, now=self._clock(), max_age_s=max_age_s
        )
        for verdict in found:
            record = self._records.get(verdict.worker)
            if record is None or record.stop_requested or verdict.worker not in awaited:
                continue
            if record.last_round != round_number:
                # A fresh process on the slot of a member that died: the reports are about
                # the dead one (its survivors report the round in force until the next).
                continue
            reporters = ", ".join(map(str, verdict.reported_by))
            logger.error(
                "worker %s unreachable from its peers (reported by %s): killing it",
                verdict.worker,
                reporters,
            )
            await self.kill(verdict.worker, f"its peers {reporters} could not reach it")

    async def kill(self, worker: WorkerId, reason: str) -> None:
        """Kill the worker's process at once (it stopped answering, ``reason`` says how);
        its exit is then classified like any other."""
        record = self._records[worker]
        record.last_heartbeat = None
        record.probe_report = None
        record.stop_requested = True
        await self._launcher.kill(worker, reason)

    def messages(self) -> list[str]:
        """The last line of what each worker reported with its result, if anything."""
        return [
            f"{w}: {r.message.strip().splitlines()[-1]}"
            for w, r in self._records.items()
            if r.message.strip()
        ]
