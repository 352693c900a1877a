"""One ElasticJob's controller: the elastic driver with pods as hosts.

The driver (``elasticjob.driver``, the same code ``elasticjob-run`` uses) decides rounds; this
module feeds it and carries out what it cannot do itself on Kubernetes. Its decisions are
pure functions in other modules; it only gathers their input and carries them out:

- the job's pods (``podmap``): watch events, create responses and re-lists (periodic, and
  sooner while the driver waits for hosts) merged by resourceVersion: none stays stale;
- scaling (``scaling.plan_pods``): worker pods up to ``replicas`` (clamped by
  ``scaling.read_spec``), off blacklisted nodes; scale-in drains the newest pods (their workers
  leave at their next check, without rollback) and deletes them once exited or after a
  deadline; a host is a Running worker pod that is not leaving and not blacklisted;
- failures: a failed, vanished or NotReady-node pod is reported to the driver as failed
  worker processes (it tells the survivors at once), and its node (or, with scope Pod, the
  pod) is blacklisted (``elasticjob.driver.blacklist``);
- after an operator restart (``adoption``): the recorded round is adopted and the recorded
  blacklisting restored; pods and the token Secret are the job's by ownerReference only;
- objects the API server refuses for good (``kube.refusal``) fail the job (InvalidSpec)
  once, with no retry; the pods it made are deleted;
- status (``status.status_of``) and events on the ElasticJob.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from elasticjob.driver.api import Clock, DriverObserver
from elasticjob.driver.blacklist import Blacklist, BlacklistPolicy
from elasticjob.driver.driver import ElasticDriver, JobResult
from elasticjob.driver.goodput import LostTo
from elasticjob.driver.hosts import HostManager
from elasticjob.driver.loop_lag import LoopLagWatch
from elasticjob.operator import pods as podlib
from elasticjob.operator.adoption import (
    Ownership,
    blacklisted_nodes,
    ownership,
    recorded_round,
    restore_blacklist,
)
from elasticjob.operator.api import (
    BlacklistScope,
    ElasticJobSpec,
    InvalidSpecError,
    LostSeconds,
    Phase,
    worker_selector,
)
from elasticjob.operator.api.podschema import PodSchema
from elasticjob.operator.api.validation import name_errors
from elasticjob.operator.disruption import DisruptionBudget
from elasticjob.operator.hosts import PodDiscovery, PodLauncher, driver_settings
from elasticjob.operator.job_records import RecordKeeper
from elasticjob.operator.kube import KubeApi, refusal
from elasticjob.operator.podmap import PodChange, PodMap
from elasticjob.operator.scaling import (
    PodPlan,
    ReplicasClamp,
    blacklist_key,
    plan_pods,
    pods_to_clean,
    read_spec,
)
from elasticjob.operator.status import Observation, observe
from elasticjob.operator.status_writer import StatusWriter
from elasticjob.operator.supervisor import Stopped
from elasticjob.operator.token import RefusedJobError, ensure_token
from elasticjob.rendezvous.server import RendezvousService
from elasticjob.wire.messages import WorkerId

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ControllerSettings:
    rendezvous_url: str
    """The URL worker pods reach the rendezvous service at."""
    rendezvous_ca: str | None = None
    """The CA certificate (PEM) workers verify an ``https`` rendezvous URL with."""
    removal_deadline_s: float = 60.0
    """How long a pod chosen for scale-in may take to exit before it is deleted anyway."""
    reconcile_interval_s: float = 1.0
    pod_schema: PodSchema | None = None
    """The API server's Pod schema: a pod template field a pod does not have is invalid."""


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
        self._not_ready_nodes = not_ready_nodes
        self._reachable = reachable
        self._observer = observer
        self._loop_lag = loop_lag
        self._clock, self._wall_clock = clock, wall_clock
        self._job: Mapping[str, Any] | None = None
        """The ElasticJob (its metadata: whose pods are its own)."""
        self._pods = PodMap(clock)
        self._reported: set[str] = set()
        self._deleted: set[str] = set()
        self._evicted: dict[str, str] = {}
        self._leaving: dict[str, float] = {}
        self._discovery = PodDiscovery()
        self._wake = asyncio.Event()
        self._status = StatusWriter(api, namespace, name, wall_clock)
        self._budget = DisruptionBudget(api, namespace)
        self._records = RecordKeeper(api, namespace, self.job_id, clock)
        self._slots = 1
        self._rank_order: list[str] = []
        self._announced_round = 0
        self._announced_restore = 0
        self._spec_read: dict[str, Any] | None = None
        """The spec as last read from the job (valid or not)."""
        self._clamp: ReplicasClamp | None = None
        self._announced_clamp: ReplicasClamp | None = None
        self.pods_created = 0
        self.pods_deleted = 0
        self._blacklist = Blacklist[str](BlacklistPolicy(), clock)
        self.driver: ElasticDriver | None = None

    @property
    def phase(self) -> Phase:
        """The job's phase as last written."""
        return self._status.phase

    # ---- pod events --------------------------------------------------------------------

    def on_pod_event(self, event_type: str, pod: Mapping[str, Any]) -> None:
        if not self._owns(pod):
            return  # it has the job's labels, not its ownerReference: not a worker
        self._merge(self._pods.apply(event_type, pod))

    def _merge(self, change: PodChange) -> None:
        for name in change.removed:
            if name not in self._deleted and name not in self._reported:
                self._fail_pod(name, "the pod disappeared", exit_code=137)
        if change.changed:
            self._wake.set()

    async def _relist(self) -> None:
        """Merge a fresh list of the job's pods: what the watch missed is caught up."""
        listed = await self._api.list_pods(self.namespace, worker_selector(self.name))
        owned = [pod for pod in listed.items if self._owns(pod)]
        self._merge(self._pods.replace(owned, listed.resource_version))

    def evict(self, name: str, reason: str) -> None:
        """A worker of this pod stopped answering (``reason``): it fails, as a failed pod does."""
        self._evicted.setdefault(name, reason)
        self._wake.set()

    def _owns(self, obj: Mapping[str, Any]) -> bool:
        return self._job is not None and ownership(obj, self._job) is Ownership.OWNED

    async def delete_pod(self, name: str, grace_s: int | None = None) -> None:
        if name not in self._deleted:
            self.pods_deleted += 1
        self._deleted.add(name)
        await self._api.delete_pod(self.namespace, name, grace_s)

    # ---- the job -----------------------------------------------------------------------

    async def run(self, body: Mapping[str, Any], stopped: Stopped) -> None:
        """Run the job until it ends or the operator stops (``stopped``)."""
        self._job = {"metadata": dict(body["metadata"])}
        try:
            if errors := name_errors(self.name):
                raise InvalidSpecError(errors)
            self._spec_read = dict(body["spec"])
            spec, self._clamp = read_spec(self._spec_read, self._settings.pod_schema)
        except InvalidSpecError as exc:
            await self._refuse(body, str(exc))
            return
        try:
            await self._run(body, spec, stopped)
        except (RefusedJobError, ApiException) as exc:
            message = str(exc) if isinstance(exc, RefusedJobError) else refusal(exc)
            if message is None:
                raise
            logger.warning("job %s: %s", self.job_id, message)
            await self._refuse(body, message)
            for name in self._pods.snapshot():
                await self.delete_pod(name)

    async def _run(self, body: Mapping[str, Any], spec: ElasticJobSpec, stopped: Stopped) -> None:
        # Three independent calls at once: a new job waits for one round trip, not three.
        # The driver comes after them: the job joins the rendezvous service with it, and
        # adopts its recorded round right after, with no API call in between.
        token, stored_record, _ = await asyncio.gather(
            ensure_token(self._api, self.namespace, body),
            self._records.load(body),
            self._relist(),
        )
        policy = spec.blacklist.policy()
        self._blacklist = Blacklist[str](policy, self._clock)
        slots = self._slots = spec.slots_per_worker
        driver = ElasticDriver(
            HostManager(self._discovery, policy, self._clock),
            lambda _driver: PodLauncher(self),
            lambda listener: self._service.add_job(
                self.job_id, token, listener, max_workers=spec.max_replicas * slots
            ),
            driver_settings(spec),
            self._clock,
            loop_lag=self._loop_lag,
        )
        self.driver = driver
        if self._observer is not None:
            driver.journal.observer = self._observer
        self._records.attach(driver, stored_record, self._wall_clock)
        driver.reachability.update(self._reachable, self._clock())
        announce = not self._adopt(body, spec, driver)
        driver_task = asyncio.create_task(driver.run(), name=f"driver {self.job_id}")
        try:
            while not driver_task.done() and not stopped.is_set():
                spec = self._current_spec(body, spec)
                await self._reconcile(body, spec)
                if announce:  # after the first reconcile: a new job's pods come first
                    announce = False
                    await self._event(body, "Created", f"job {self.job_id} started")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._settings.reconcile_interval_s)
                self._wake.clear()
            if driver_task.done():
                await self._finish(body, spec, driver_task.result())
        finally:
            driver_task.cancel()
            await asyncio.gather(driver_task, return_exceptions=True)
            self._service.remove_job(self.job_id)

    def set_reachable(self, reachable: bool) -> None:
        """Whether workers can reach the operator now (its pod is ready): while they cannot,
        their silence is not held against them."""
        self._reachable = reachable
        if self.driver is not None:
            self.driver.reachability.update(reachable, self._clock())

    def _adopt(self, body: Mapping[str, Any], spec: ElasticJobSpec, driver: ElasticDriver) -> bool:
        """After an operator restart: keep the recorded blacklisting until its recorded ends,
        and take over the recorded round, so its workers train on undisturbed, the count
        of resets, so ``resetLimit`` counts those before the restart, and the lost time, so
        goodput covers the whole job. Members whose pods are
        gone are reported failed."""
        status = self._status.recorded(body)
        driver.resume_resets(status.reset_count, status.last_reset_reason)
        if status.progress is not None:  # the steps a durable fallback loses count from it
            driver.journal.committed_step = status.progress.committed_step
        if spec.blacklist.scope is BlacklistScope.NODE:
            restore_blacklist(
                self._blacklist, status.blacklisted_nodes, self._wall_clock(), self._clock()
            )
        recorded = recorded_round(status, self._slots)
        if recorded is not None:
            driver.adopt(recorded.round, recorded.slots, recorded.notice_seq)
        if status.start_time is not None:
            running_for = self._wall_clock() - status.start_time.timestamp()
            lost = status.goodput.lost_seconds if status.goodput else LostSeconds()
            driver.journal.resume_lost_time(
                {cause: getattr(lost, cause.value) for cause in LostTo}, running_for
            )
        if recorded is None:
            return False
        self._rank_order = list(recorded.rank_order)
        pods = self._pods.snapshot()
        for pod in recorded.rank_order:
            if pod not in pods:
                self._fail_pod(pod, "the pod disappeared while the operator was away", 137)
        logger.info(
            "job %s: resumed round %s after an operator restart", self.job_id, recorded.round
        )
        return True

    def _current_spec(self, body: Mapping[str, Any], spec: ElasticJobSpec) -> ElasticJobSpec:
        """The job's spec as ``body`` has it now; ``spec`` (the current one) when it is
        unchanged since last read (validating a pod template costs more than the rest of a
        reconcile) or when the update is invalid (said once)."""
        raw = dict(body["spec"])
        if raw == self._spec_read:
            return spec
        self._spec_read = raw
        try:
            spec, self._clamp = read_spec(raw, self._settings.pod_schema)
        except InvalidSpecError as exc:
            logger.warning("job %s: ignoring an invalid spec update: %s", self.job_id, exc)
        return spec

    async def _refuse(self, body: Mapping[str, Any], message: str) -> None:
        await self._status.write(body, Observation.refused(message))
        await self._event(body, "InvalidSpec", message, warning=True)

    async def _event(
        self, body: Mapping[str, Any], reason: str, message: str, warning: bool = False
    ) -> None:
        await self._api.event(self.namespace, dict(body), reason, message, warning)

    # ---- reconciliation ----------------------------------------------------------------

    async def _reconcile(self, body: Mapping[str, Any], spec: ElasticJobSpec) -> None:
        assert self.driver is not None
        self._records.note_replicas(self.driver, spec.replicas)
        now = self._clock()
        if self._pods.resync_due(waiting=len(self._discovery.hosts) < spec.replicas):
            await self._relist()  # the driver waits for hosts: a missed event may hide one
        views = {
            name: podlib.view(pod, not_ready_nodes=self._not_ready_nodes, evicted=self._evicted)
            for name, pod in self._pods.snapshot().items()
        }
        for view in views.values():
            await self._account(body, spec, view)
        plan = plan_pods(
            spec,
            views,
            blacklisted=self._blacklist.active().keys(),
            leaving=self._leaving,
            deleted=self._deleted,
            rank_order=self._rank_order,
            now=now,
            removal_deadline_s=self._settings.removal_deadline_s,
        )
        try:
            await self._carry_out(body, spec, plan, views, now)
        except ApiException:  # a create refused (a full quota): the running pods keep both
            await self._keep_budget_and_record(body, spec)
            raise
        await self._keep_budget_and_record(body, spec)
        if self.driver.round != self._announced_round:
            self._announced_round = self.driver.round
            pods = sorted({w.hostname for w in self.driver.slots})
            await self._event(
                body,
                "RoundFormed",
                f"round {self.driver.round}: {len(self.driver.slots)} workers in {', '.join(pods)}",
            )
        restore = self.driver.journal.restore
        if restore is not None and restore.round != self._announced_restore:
            self._announced_restore = restore.round
            lost = "an unknown number of" if restore.steps_lost is None else restore.steps_lost
            await self._event(
                body,
                "RestoredFromCheckpoint",
                f"no worker survived: round {restore.round} resumed from checkpoint "
                f"{restore.checkpoint.name} (step {restore.checkpoint.step}); {lost} committed "
                "steps are trained again",
                warning=True,
            )
        if self._clamp is not None and self._clamp != self._announced_clamp:
            logger.warning("job %s: %s", self.job_id, self._clamp)
            await self._event(body, "ReplicasClamped", str(self._clamp), warning=True)
        self._announced_clamp = self._clamp
        await self._status.write(body, self._observe(spec, views))

    async def _keep_budget_and_record(self, body: Mapping[str, Any], spec: ElasticJobSpec) -> None:
        """The job's PodDisruptionBudget and record, after its pods: a new job's first pods
        wait for neither."""
        assert self.driver is not None
        await self._budget.ensure(body, spec.min_replicas)
        await self._records.save(body, self.driver)

    async def _carry_out(
        self,
        body: Mapping[str, Any],
        spec: ElasticJobSpec,
        plan: PodPlan,
        views: Mapping[str, podlib.PodView],
        now: float,
    ) -> None:
        for name in plan.forget:
            del self._leaving[name]
        for name in plan.drain:
            self._leaving[name] = now
            await self._event(body, "ScalingIn", f"pod {name} leaves the job")
        self._discovery.hosts = {name: spec.slots_per_worker for name in plan.hosts}
        avoid = self._blacklist.active() if spec.blacklist.scope is BlacklistScope.NODE else {}
        await self._create_pods(body, spec, plan.create, avoid)
        for name in plan.delete:
            await self.delete_pod(name)
        for name in plan.overdue:
            logger.warning("job %s: pod %s did not leave in time", self.job_id, name)
            self._fail_pod(name, "did not leave in time", exit_code=1)
            await self.delete_pod(name, grace_s=0)

    async def _create_pods(
        self, body: Mapping[str, Any], spec: ElasticJobSpec, count: int, avoid: Iterable[str]
    ) -> None:
        """Create ``count`` worker pods at once (one API round trip, not ``count``); the first
        error is raised once every create has answered."""
        if count == 0:
            return  # most reconciles: no pod manifest to build
        pod = podlib.worker_pod(
            body,
            spec,
            rendezvous_url=self._settings.rendezvous_url,
            rendezvous_ca=self._settings.rendezvous_ca,
            avoid_nodes=avoid,
        )
        answers = await asyncio.gather(
            *(self._api.create_pod(self.namespace, copy.deepcopy(pod)) for _ in range(count)),
            return_exceptions=True,
        )
        for created in answers:
            if not isinstance(created, BaseException):
                self.pods_created += 1
                self._merge(self._pods.apply("ADDED", created))
        if errors := [a for a in answers if isinstance(a, BaseException)]:
            raise errors[0]

    async def _account(
        self, body: Mapping[str, Any], spec: ElasticJobSpec, view: podlib.PodView
    ) -> None:
        """Report pods that ended to the driver, once each; blacklist failed ones' nodes."""
        if view.name in self._reported:
            return
        if view.state is podlib.PodState.FAILED:
            self._fail_pod(view.name, view.reason, exit_code=view.exit_code or 1)
            await self._event(
                body,
                "WorkerFailed",
                f"pod {view.name} on {view.node}: {view.reason}",
                warning=True,
            )
            node_scope = spec.blacklist.scope is BlacklistScope.NODE
            key = blacklist_key(view, spec.blacklist.scope)
            if key is not None:
                self._blacklist.add(key)
                await self._event(
                    body,
                    "NodeBlacklisted" if node_scope else "PodBlacklisted",
                    f"{'node' if node_scope else 'pod'} {key} blacklisted",
                    warning=True,
                )
            await self.delete_pod(view.name, grace_s=0)
        elif view.state is podlib.PodState.SUCCEEDED:
            self._reported.add(view.name)
            self._exit_workers(view.name, 0, spec.slots_per_worker)
            member = self.driver is not None and WorkerId(view.name, 0) in self.driver.slots
            if not member:  # the driver removed it (scale-in, drain): make room
                await self.delete_pod(view.name)
            # A member that succeeded finished training: it stays, as cleanPodPolicy says.

    def _fail_pod(self, name: str, reason: str, exit_code: int) -> None:
        self._reported.add(name)
        logger.warning("job %s: worker pod %s failed: %s", self.job_id, name, reason)
        self._exit_workers(name, exit_code, self._slots)

    def _exit_workers(self, pod: str, exit_code: int, slots: int) -> None:
        if self.driver is None:
            return
        for slot in range(slots):
            self.driver.on_worker_exit(WorkerId(pod, slot), exit_code)

    def _observe(self, spec: ElasticJobSpec, views: Mapping[str, podlib.PodView]) -> Observation:
        assert self.driver is not None
        nodes = []
        if spec.blacklist.scope is BlacklistScope.NODE:
            nodes = blacklisted_nodes(self._blacklist, self._wall_clock(), self._clock())
        clamp = None if self._clamp is None else str(self._clamp)
        return observe(self.driver, spec, views, self._leaving.keys(), nodes, clamp)

    async def _finish(
        self, body: Mapping[str, Any], spec: ElasticJobSpec, result: JobResult
    ) -> None:
        reason = "Succeeded" if result.success else "Failed"
        await self._event(body, reason, result.message, warning=not result.success)
        views = {name: podlib.view(pod) for name, pod in self._pods.snapshot().items()}
        await self._status.write(body, self._observe(spec, views))
        assert self.driver is not None
        await self._records.save(body, self.driver, now=True)
        for name in pods_to_clean(list(views.values()), spec.clean_pod_policy):
            await self.delete_pod(name)
