"""One ElasticJob's controller: the elastic driver with pods as hosts.

The driver (``elasticjob.driver``, the same code ``elasticjob-run`` uses) decides rounds, and
what follows a worker's end; this module feeds it and carries out on Kubernetes what it cannot
do itself. Its decisions are pure functions in other modules; it gathers their input and
carries them out:

- the job's pods (``pod_reconciler``, their one owner, and its ``pod_ledger``): watch events,
  create responses and re-lists merged by resourceVersion; the usable pods pushed to the
  driver as its hosts the moment they change; scaling (``scaling.plan_pods``) up to
  ``replicas``, off blacklisted nodes, scale-in draining the newest pods;
- failures: a failed, vanished or NotReady-node pod, or one whose worker the driver killed,
  goes through the ledger's one ``fail`` transition and is reported to the driver once, with
  its cause; the driver blacklists and tells the survivors, and the pod is announced and
  deleted as the driver's effects say (``elasticjob.driver.worker_exits``);
- after an operator restart (``adoption``): the round in force that the job's record holds is
  adopted and its blacklisting restored (the record, never the status, is what a driver
  resumes from); pods and the job's Secret are the job's by ownerReference only;
- objects the API server refuses for good (``kube_errors.permanent_error``) fail the job
  (InvalidSpec) once; the pods it made are deleted;
- status (``status_observation`` and ``status_render``, from the driver's snapshot) and
  events on the ElasticJob (``job_events``);
- suspension (``spec.suspend``): the driver saves the round's state and ends its run; the
  pods are deleted, the status says Suspended, and the controller waits until
  ``spec.suspend`` is false; the next run's first round loads the newest checkpoint.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from elasticjob.driver.driver import ElasticDriver
from elasticjob.driver.driver_types import Clock, DriverObserver, JobResult
from elasticjob.driver.host_manager import HostManager
from elasticjob.driver.job_record import EventKind, JobRecordData
from elasticjob.driver.job_snapshot import JobSnapshot
from elasticjob.driver.job_state import JobState, blacklist_entries
from elasticjob.driver.loop_lag import LoopLagWatch
from elasticjob.event_waits import wait_event
from elasticjob.operator import pods as podlib
from elasticjob.operator.adoption import (
    resume_job,
    resumption_message,
)
from elasticjob.operator.api import BlacklistScope, ElasticJobSpec, InvalidSpecError, Phase
from elasticjob.operator.api.validation import name_errors, namespace_errors
from elasticjob.operator.controller_settings import ControllerSettings
from elasticjob.operator.job_records import RecordKeeper
from elasticjob.operator.job_secret import PodCredentials, RefusedJobError, ensure_job_secret
from elasticjob.operator.job_story import history_of
from elasticjob.operator.kube import KubeApi
from elasticjob.operator.kube_errors import permanent_error
from elasticjob.operator.pod_guards import PodGuards
from elasticjob.operator.pod_launcher import PodLauncher, driver_settings
from elasticjob.operator.pod_reconciler import PodReconciler
from elasticjob.operator.scaling import SpecReader, pods_to_clean
from elasticjob.operator.status_observation import Observation, blacklisted_nodes, observe
from elasticjob.operator.status_writer import StatusWriter
from elasticjob.operator.supervisor import Stopped
from elasticjob.rendezvous.rendezvous_types import JobRendezvous, RendezvousListener
from elasticjob.rendezvous.server import RendezvousService

logger = logging.getLogger(__name__)


class JobController:
    """Runs one ElasticJob (see the module docstring)."""

    def __init__(
        self,
        namespace: str,
        name: str,
        api: KubeApi,
        service: RendezvousService,
        settings: ControllerSettings,
        not_ready_nodes: set[str],
        *,
        reachable: bool = True,
        observer: DriverObserver | None = None,
        loop_lag: LoopLagWatch | None = None,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
    ) -> None:
        self.namespace, self.name = namespace, name
        self.job_id = podlib.job_id(namespace, name)
        self._api = api
        self._service = service
        self._settings = settings
        self._reachable = reachable
        self._observer = observer
        self._loop_lag = loop_lag
        self._clock, self._wall_clock = clock, wall_clock
        self._wake = asyncio.Event()
        self.pods = PodReconciler(
            namespace, name, api, settings, not_ready_nodes, self._wake, clock
        )
        """The job's worker pods (their one owner)."""
        self._status = StatusWriter(api, namespace, name, wall_clock)
        self._guards = PodGuards(api, namespace, network_policy=settings.worker_network_policy)
        self._records = RecordKeeper(api, namespace, self.job_id, clock)
        self._spec = SpecReader(self.job_id, settings.pod_schema)
        self.driver: ElasticDriver | None = None
        self.suspensions = 0
        """Times this controller saw the job suspended."""

    @property
    def phase(self) -> Phase:
        """The job's phase as last written."""
        return self._status.phase

    @property
    def pods_created(self) -> int:
        return self.pods.pods_created

    @property
    def pods_deleted(self) -> int:
        return self.pods.pods_deleted

    def snapshot(self) -> JobSnapshot | None:
        """What the job's driver knows now (None: it has not started)."""
        return None if self.driver is None else self.driver.snapshot()

    def on_pod_event(self, event_type: str, pod: Mapping[str, Any]) -> None:
        """A watch event of a pod with the job's labels."""
        self.pods.on_pod_event(event_type, pod)

    def job_updated(self) -> None:
        """The job's body (``run``'s ``body``) was just updated: act on it now."""
        self._wake.set()

    def set_reachable(self, reachable: bool) -> None:
        """Whether workers can reach the operator now (its pod is ready): while they cannot,
        their silence is not held against them."""
        self._reachable = reachable
        if self.driver is not None:
            self.driver.reachability.update(reachable, self._clock())

    # ---- the job -----------------------------------------------------------------------

    async def run(self, body: Mapping[str, Any], stopped: Stopped) -> None:
        """Run the job until it ends or the operator stops (``stopped``); a suspended job
        waits here until it is resumed (``suspension`` in the module docstring)."""
        self.pods.job = {"metadata": dict(body["metadata"])}
        try:
            where = namespace_errors(self.namespace, self._settings.operator_namespace)
            if errors := [*name_errors(self.name), *where]:
                raise InvalidSpecError(errors)
            spec = self._spec.first(body["spec"])
        except InvalidSpecError as exc:
            await self._refuse(body, str(exc))
            return
        try:
            while not stopped.is_set():
                stored, spec = await self._records.load(body), self._spec.current(body["spec"])
                state = JobState() if stored is None else stored.state
                if state.suspended_since is not None or (spec.suspend and state.round is None):
                    await self._stay_suspended(body, spec, stopped, stored)
                    if stopped.is_set():
                        return
                result = await self._run(body, self._spec.current(body["spec"]), stopped)
                if result is None or not result.suspended:
                    return
        except (RefusedJobError, ApiException) as exc:
            message = str(exc) if isinstance(exc, RefusedJobError) else permanent_error(exc)
            if message is None:
                raise
            logger.warning("job %s: %s", self.job_id, message)
            await self._refuse(body, message)
            for name in self.pods.ledger.pods.snapshot():
                await self.pods.delete_pod(name)

    async def _stay_suspended(
        self,
        body: Mapping[str, Any],
        spec: ElasticJobSpec,
        stopped: Stopped,
        stored: JobRecordData | None,
    ) -> None:
        """The job is suspended (its record, ``stored``, says so), or is to be with no round
        to save: its last run's workers exit on their own and its pods are deleted, the
        record and the status say Suspended, and this waits until ``spec.suspend`` is false
        and every pod is gone (their ends are not the next run's), or the operator stops."""
        self.driver = None  # a suspended job has no run
        state = JobState() if stored is None else stored.state
        if state.suspended_since is None:
            self.suspensions += 1
            message = "suspended before a round trained: no pods run until spec.suspend is false"
            await self._records.suspended_without_a_run(body, stored, message, self._wall_clock)
            await self._status.write(body, Observation.suspended(message, spec, state))
            await self._event(body, "Suspended", message)
        await self.pods.relist()
        deadline_s = self._settings.removal_deadline_s
        await self._no_pod_running(stopped, deadline_s)  # told the job finished: they exit
        for name in self.pods.ledger.pods.snapshot():
            await self.pods.delete_pod(name)
        forced, deadline = False, self._clock() + deadline_s
        while not stopped.is_set() and (
            self._spec.current(body["spec"]).suspend or self.pods.ledger.pods.snapshot()
        ):
            if not forced and self._clock() > deadline:  # stuck terminating (a lost node)
                forced = True
                for name in self.pods.ledger.pods.snapshot():
                    await self.pods.delete_pod(name, grace_s=0)
            await wait_event(self._wake, self._settings.reconcile_interval_s)
            self._wake.clear()

    async def _run(
        self, body: Mapping[str, Any], spec: ElasticJobSpec, stopped: Stopped
    ) -> JobResult | None:
        """Run the job's driver until the job ends or is suspended (its result), or the
        operator stops (None)."""
        # Three independent calls at once (one round trip, not three); then the driver: the job
        # joins the service with it and adopts its recorded round, no API call in between.
        secret, stored_record, _ = await asyncio.gather(
            ensure_job_secret(self._api, self.namespace, body),
            self._records.load(body),
            self.pods.relist(),
        )
        self.pods.configure(spec, PodCredentials(self._api, self.namespace, self.name, secret))

        def join_service(listener: RendezvousListener) -> JobRendezvous:
            workers = spec.max_replicas * spec.slots_per_worker
            beat = driver_settings(spec).heartbeat_interval_s
            job = self._service.add_job(
                self.job_id, secret.key, listener, max_workers=workers, heartbeat_interval_s=beat
            )
            health = self.pods.health
            check = spec.health_check
            health.checks = None if check is None else job.check_health(check.policy(), health)
            return job

        driver = ElasticDriver(
            HostManager(self.pods.blacklist),
            lambda _driver: PodLauncher(self.pods),
            join_service,
            driver_settings(spec),
            self._clock,
            loop_lag=self._loop_lag,
        )
        self.pods.attach(driver)
        self.driver = driver
        if self._observer is not None:
            driver.observe(self._observer)
        saver = self._records.attach(body, driver, stored_record, self._wall_clock)
        driver.reachability.update(self._reachable, self._clock())
        adopted = stored_record is not None and self._adopt(spec, driver, stored_record)
        announce = self._resumption(driver, stored_record) or (
            None if adopted else ("Created", f"job {self.job_id} started")
        )
        driver_task = asyncio.create_task(driver.run(), name=f"driver {self.job_id}")
        saver_task = asyncio.create_task(saver.run(), name=f"record {self.job_id}")
        try:
            while not driver_task.done() and not stopped.is_set():
                spec = self._spec.current(body["spec"])
                if spec.suspend:
                    driver.suspend()
                await self._reconcile(body, spec)
                if announce:  # after the first pass: a new job's pods come first
                    await self._event(body, *announce)
                    announce = None
                await wait_event(self._wake, self._settings.reconcile_interval_s)
                self._wake.clear()
            if driver_task.done():
                result = driver_task.result()
                await self._finish(body, spec, result)
                return result
            return None
        finally:
            # Handed over to another operator: the job leaves the service before its driver
            # stops, so that its workers' pending waits end as if they ran out (they ask
            # again, and reach the new leader) rather than with the stopped driver's FINISHED.
            handed_over = stopped.handover and not driver_task.done()
            if handed_over:
                self._service.release_job(self.job_id)
            for task in (driver_task, saver_task):
                task.cancel()
            await asyncio.gather(driver_task, saver_task, return_exceptions=True)
            if not handed_over:
                self._service.remove_job(self.job_id)

    def _resumption(
        self, driver: ElasticDriver, stored: JobRecordData | None
    ) -> tuple[str, str] | None:
        """A suspended job resumes (its record, ``stored``, says it is suspended): its rounds
        are numbered on after the newest the record holds, and the first one's rank 0 loads
        the newest checkpoint; return the event that says so (None: it was not suspended)."""
        if stored is None or stored.state.suspended_since is None:
            return None
        state = stored.state
        driver.continue_after(state.last_round)
        return "Resumed", resumption_message(
            state, self.job_id, checkpoints=driver.settings.checkpoint_fallback
        )

    def _adopt(self, spec: ElasticJobSpec, driver: ElasticDriver, stored: JobRecordData) -> bool:
        """When the job's driver starts again: carry on what its record holds
        (``resume_job``). Members of the recorded round whose pods are gone are reported
        failed."""
        recorded = resume_job(
            driver, stored, self.pods.slots, wall_now=self._wall_clock(), mono_now=self._clock()
        )
        if recorded is None:
            return False
        self.pods.rank_order = list(recorded.rank_order)
        for failure in self.pods.ledger.adopted_round_gone(recorded.rank_order):
            self.pods.fail(failure)
        logger.info(
            "job %s: resumed round %s after an operator restart", self.job_id, recorded.round
        )
        return True

    async def _refuse(self, body: Mapping[str, Any], message: str) -> None:
        await self._status.write(body, Observation.refused(message))
        await self._event(body, "InvalidSpec", message, warning=True)

    async def _event(
        self, body: Mapping[str, Any], reason: str, message: str, warning: bool = False
    ) -> None:
        await self._api.event(self.namespace, dict(body), reason, message, warning)

    async def _post_events(self, body: Mapping[str, Any]) -> None:
        for event in self.pods.events.take():
            await self._event(body, event.reason, event.message, event.warning)

    # ---- a pass ------------------------------------------------------------------------

    async def _reconcile(self, body: Mapping[str, Any], spec: ElasticJobSpec) -> None:
        assert self.driver is not None
        self._records.note_replicas(self.driver, spec.replicas)
        try:
            views = await self.pods.reconcile(body, spec)
        finally:  # a create refused (a full quota): the running pods keep their budget
            await self._guards.ensure(body, spec.min_replicas)
        if clamp := self._spec.new_clamp():
            logger.warning("job %s: %s", self.job_id, clamp)
            self.pods.note(EventKind.CLAMPED, str(clamp), "", True)
        await self._post_events(body)
        await self._status.write(body, self._observe(spec, views))

    def _observe(self, spec: ElasticJobSpec, views: Mapping[str, podlib.PodView]) -> Observation:
        assert self.driver is not None
        nodes = []
        if spec.blacklist.scope is BlacklistScope.NODE:
            offset = self._wall_clock() - self._clock()
            nodes = blacklisted_nodes(blacklist_entries(self.pods.blacklist, offset))
        clamp = None if self._spec.clamp is None else str(self._spec.clamp)
        draining = self.pods.ledger.draining.keys()
        snapshot = self.driver.snapshot()
        journal = self.driver.journal
        history = history_of(journal.record.events)
        suspended_s = journal.suspended_seconds
        return observe(snapshot, spec, views, draining, nodes, clamp, suspended_s, history)

    async def _finish(
        self, body: Mapping[str, Any], spec: ElasticJobSpec, result: JobResult
    ) -> None:
        await self._post_events(body)
        if result.suspended:
            await self._suspended(body, spec, result)
            return
        reason = "Succeeded" if result.success else "Failed"
        await self._event(body, reason, result.message, warning=not result.success)
        snapshot = self.pods.ledger.pods.snapshot()
        views = {name: podlib.view(pod) for name, pod in snapshot.items()}
        await self._status.write(body, self._observe(spec, views))
        if self._records.saver is not None:
            await self._records.saver.save_now()
        for name in pods_to_clean(list(views.values()), spec.clean_pod_policy):
            await self.pods.delete_pod(name)

    async def _suspended(
        self, body: Mapping[str, Any], spec: ElasticJobSpec, result: JobResult
    ) -> None:
        """The run ended suspended: the record says so (first: an operator taking over from
        here finds the job suspended), then the status, and the event is posted; the pods go
        while the job stays suspended (:meth:`_stay_suspended`)."""
        self.suspensions += 1
        if self._records.saver is not None:
            await self._records.saver.save_now()
        await self._status.write(body, self._observe(spec, {}))
        await self._event(body, "Suspended", result.message)

    async def _no_pod_running(self, stopped: Stopped, within_s: float) -> None:
        """Wait until no pod of the job runs (woken by their watch events), ``within_s`` at
        most, or until the operator stops."""
        deadline = self._clock() + within_s
        while not stopped.is_set() and self._clock() < deadline:
            views = self.pods.ledger.views(set()).values()
            if all(view.state is not podlib.PodState.RUNNING for view in views):
                return
            self._wake.clear()
            wait_s = min(deadline - self._clock(), self._settings.reconcile_interval_s)
            await wait_event(self._wake, wait_s)
