"""One ElasticJob's controller: the elastic driver with pods as hosts.

The driver (``elasticjob.driver``, the same code ``elasticjob-run`` uses) decides rounds; this
module feeds it and carries out what it cannot do itself on Kubernetes:

- discovery: a host is a Running worker pod that is not leaving and not on a blacklisted
  node; its slots are ``slotsPerWorker``;
- scaling: worker pods are created up to ``replicas`` (clamped to [min, max]), off
  blacklisted nodes; scale-in picks the newest pods, drops them from discovery (the driver
  tells their workers, which leave at their next check without rollback) and deletes them
  once they have exited, or after a deadline;
- failures: a failed, vanished or NotReady-node pod is reported to the driver as failed
  worker processes (it tells the survivors at once), and its node is blacklisted;
- status and events on the ElasticJob.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from elasticjob.driver.api import HostDiscovery, WorkerLauncher
from elasticjob.driver.blacklist import Blacklist, BlacklistPolicy
from elasticjob.driver.driver import DriverSettings, ElasticDriver, JobResult
from elasticjob.driver.driver import Phase as DriverPhase
from elasticjob.driver.hosts import HostManager
from elasticjob.driver.slots import assign_slots
from elasticjob.operator import pods as podlib
from elasticjob.operator.api import (
    BlacklistScope,
    ElasticJobSpec,
    InvalidSpecError,
    Phase,
    parse_spec,
    worker_selector,
)
from elasticjob.operator.api.podschema import PodSchema
from elasticjob.operator.kube import KubeApi
from elasticjob.operator.status import Observation, status_of
from elasticjob.rendezvous.server import RendezvousService
from elasticjob.wire import WorkerId

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ControllerSettings:
    rendezvous_url: str
    """The URL worker pods reach the rendezvous service at."""
    removal_deadline_s: float = 60.0
    """How long a pod chosen for scale-in may take to exit before it is deleted anyway."""
    reconcile_interval_s: float = 1.0
    pod_schema: PodSchema | None = None
    """The API server's Pod schema: a pod template field a pod does not have is invalid."""


class Stopped(Protocol):
    """Set when the operator stops (kopf's ``stopped`` flag of a daemon)."""

    def is_set(self) -> bool: ...


class PodDiscovery(HostDiscovery):
    """Hosts as the controller last computed them from the job's pods."""

    def __init__(self) -> None:
        self.hosts: dict[str, int] = {}

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        return dict(self.hosts)


class PodLauncher(WorkerLauncher):
    """Pods start their worker processes themselves; stopping a worker deletes its pod."""

    def __init__(self, controller: JobController) -> None:
        self._controller = controller

    async def start(self, worker: WorkerId) -> None:
        return None

    async def stop(self, worker: WorkerId) -> None:
        await self._controller.delete_pod(worker.hostname)

    async def stop_all(self) -> None:
        return None  # the clean-pod policy decides, once the job has ended


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
    ) -> None:
        self.namespace, self.name = namespace, name
        self.job_id = podlib.job_id(namespace, name)
        self._api = api
        self._service = service
        self._settings = settings
        self._not_ready_nodes = not_ready_nodes
        self._pods: dict[str, dict[str, Any]] = {}
        self._reported: set[str] = set()
        self._deleted: set[str] = set()
        self._chosen_to_leave: dict[str, float] = {}
        self._discovery = PodDiscovery()
        self._wake = asyncio.Event()
        self._last_status: dict[str, Any] | None = None
        self._slots = 1
        self._rank_order: list[str] = []
        self._announced_round = 0
        self.phase: Phase = Phase.CREATED
        self.pods_created = 0
        self.pods_deleted = 0
        self._nodes = Blacklist[str](BlacklistPolicy())
        self.driver: ElasticDriver | None = None

    # ---- pod events --------------------------------------------------------------------

    def on_pod_event(self, event_type: str, pod: Mapping[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if event_type == "DELETED":
            gone = self._pods.pop(name, None)
            if gone is not None and name not in self._deleted and name not in self._reported:
                self._fail_pod(podlib.view(gone), "the pod disappeared", exit_code=137)
        else:
            self._pods[name] = dict(pod)
        self._wake.set()

    async def delete_pod(self, name: str, grace_s: int | None = None) -> None:
        if name not in self._deleted:
            self.pods_deleted += 1
        self._deleted.add(name)
        await self._api.delete_pod(self.namespace, name, grace_s)

    # ---- the job -----------------------------------------------------------------------

    async def run(self, body: Mapping[str, Any], stopped: Stopped) -> None:
        """Run the job until it ends or the operator stops (``stopped``)."""
        try:
            spec = parse_spec(dict(body["spec"]), self._settings.pod_schema)
        except InvalidSpecError as exc:
            await self._refuse(body, str(exc))
            return
        token = await self._ensure_token(body)
        policy = spec.blacklist.policy()
        self._nodes = Blacklist[str](policy)
        slots = self._slots = spec.slots_per_worker
        driver = ElasticDriver(
            HostManager(self._discovery, policy),
            lambda _driver: PodLauncher(self),
            lambda listener: self._service.add_job(self.job_id, token, listener),
            DriverSettings(
                min_np=spec.min_replicas * slots,
                max_np=spec.max_replicas * slots,
                reset_limit=spec.reset_limit,
                elastic_timeout_s=float(spec.elastic_timeout_seconds),
            ),
            time.monotonic,
        )
        self.driver = driver
        for pod in await self._api.list_pods(self.namespace, worker_selector(self.name)):
            self._pods[pod["metadata"]["name"]] = pod
        if not self._adopt(body, driver):
            await self._api.event(
                self.namespace, dict(body), "Created", f"job {self.job_id} started"
            )
        driver_task = asyncio.create_task(driver.run(), name=f"driver {self.job_id}")
        try:
            while not driver_task.done() and not stopped.is_set():
                spec = self._current_spec(body, spec)
                await self._reconcile(body, spec)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._settings.reconcile_interval_s)
                self._wake.clear()
            if driver_task.done():
                await self._finish(body, spec, driver_task.result())
        finally:
            driver_task.cancel()
            await asyncio.gather(driver_task, return_exceptions=True)
            self._service.remove_job(self.job_id)

    def _adopt(self, body: Mapping[str, Any], driver: ElasticDriver) -> bool:
        """After an operator restart: take over the round the status records, so its workers
        train on undisturbed. Members whose pods are gone are reported failed."""
        status = body.get("status") or {}
        workers = status.get("workers") or []
        if not status.get("round") or not workers:
            return False
        order = sorted(workers, key=lambda w: min(w["ranks"] or [0]))
        slots = assign_slots([(w["pod"], self._slots) for w in order], min_np=1, max_np=None)
        recorded = {(w["pod"], r) for w in workers for r in w["ranks"]}
        if {(worker.hostname, slot.rank) for worker, slot in slots.items()} != recorded:
            logger.warning(
                "job %s: the recorded round does not fit its pods; not adopted", self.job_id
            )
            return False
        driver.adopt(int(status["round"]), slots, int(status.get("noticeSeq") or 0))
        self._rank_order = [w["pod"] for w in order]
        for worker in slots:
            if worker.hostname not in self._pods:
                self._fail_pod(
                    podlib.PodView(worker.hostname, podlib.PodState.FAILED, None, None, ""),
                    "the pod disappeared while the operator was away",
                    137,
                )
        logger.info(
            "job %s: resumed round %s after an operator restart", self.job_id, status["round"]
        )
        return True

    def _current_spec(self, body: Mapping[str, Any], spec: ElasticJobSpec) -> ElasticJobSpec:
        try:
            return parse_spec(dict(body["spec"]), self._settings.pod_schema)
        except InvalidSpecError as exc:
            logger.warning("job %s: ignoring an invalid spec update: %s", self.job_id, exc)
            return spec

    async def _ensure_token(self, body: Mapping[str, Any]) -> str:
        name = podlib.token_secret_name(self.name)
        token = await self._api.read_secret_value(self.namespace, name, podlib.TOKEN_KEY)
        if token is None:
            await self._api.create_secret(self.namespace, podlib.token_secret(body))
            token = await self._api.read_secret_value(self.namespace, name, podlib.TOKEN_KEY)
        assert token is not None
        return token

    async def _refuse(self, body: Mapping[str, Any], message: str) -> None:
        obs = Observation(
            driver_phase=DriverPhase.STARTING,
            result=None,
            recovering=False,
            desired=0,
            live=0,
            pending=0,
            leaving=0,
            round=0,
            world_size=0,
            invalid_spec=message,
        )
        await self._write_status(body, obs)
        await self._api.event(self.namespace, dict(body), "InvalidSpec", message, warning=True)

    # ---- reconciliation ----------------------------------------------------------------

    async def _reconcile(self, body: Mapping[str, Any], spec: ElasticJobSpec) -> None:
        assert self.driver is not None
        now = time.monotonic()
        views = {
            name: podlib.view(pod, not_ready_nodes=self._not_ready_nodes)
            for name, pod in self._pods.items()
        }
        for view in views.values():
            await self._account(body, spec, view)
        blacklisted = self._nodes.active()
        if spec.blacklist.scope is BlacklistScope.NODE:
            for v in views.values():  # drain blacklisted nodes: those pods leave gracefully
                if v.state is podlib.PodState.RUNNING and v.node in blacklisted:
                    self._chosen_to_leave.setdefault(v.name, now)
        usable = [
            v
            for v in views.values()
            if v.state is podlib.PodState.RUNNING
            and v.name not in self._chosen_to_leave
            and not (spec.blacklist.scope is BlacklistScope.NODE and v.node in blacklisted)
        ]
        # Oldest first (a resumed round's members in rank order), so rank 0 keeps the state.
        rank = {pod: i for i, pod in enumerate(self._rank_order)}
        usable.sort(key=lambda v: (rank.get(v.name, len(rank)), v.created, v.name))
        self._discovery.hosts = {v.name: spec.slots_per_worker for v in usable}
        await self._scale(body, spec, views, blacklisted, now)
        if self.driver.round != self._announced_round:
            self._announced_round = self.driver.round
            pods = sorted({w.hostname for w in self.driver.slots})
            await self._api.event(
                self.namespace,
                dict(body),
                "RoundFormed",
                f"round {self.driver.round}: {len(self.driver.slots)} workers in {', '.join(pods)}",
            )
        await self._write_status(body, self._observe(spec, views, blacklisted))

    async def _account(
        self, body: Mapping[str, Any], spec: ElasticJobSpec, view: podlib.PodView
    ) -> None:
        """Report pods that ended to the driver, once each."""
        if view.name in self._reported:
            return
        if view.state is podlib.PodState.FAILED:
            self._fail_pod(view, view.reason, exit_code=view.exit_code or 1)
            await self._api.event(
                self.namespace,
                dict(body),
                "WorkerFailed",
                f"pod {view.name} on {view.node}: {view.reason}",
                warning=True,
            )
            if view.node and spec.blacklist.scope is BlacklistScope.NODE:
                self._nodes.add(view.node)
                await self._api.event(
                    self.namespace,
                    dict(body),
                    "NodeBlacklisted",
                    f"node {view.node} blacklisted",
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

    def _fail_pod(self, view: podlib.PodView, reason: str, exit_code: int) -> None:
        self._reported.add(view.name)
        logger.warning("job %s: worker pod %s failed: %s", self.job_id, view.name, reason)
        self._exit_workers(view.name, exit_code, self._slots)

    def _exit_workers(self, pod: str, exit_code: int, slots: int) -> None:
        if self.driver is None:
            return
        for slot in range(slots):
            self.driver.on_worker_exit(WorkerId(pod, slot), exit_code)

    async def _scale(
        self,
        body: Mapping[str, Any],
        spec: ElasticJobSpec,
        views: Mapping[str, podlib.PodView],
        blacklisted: Mapping[str, float],
        now: float,
    ) -> None:
        desired = max(spec.min_replicas, min(spec.replicas, spec.max_replicas))
        live = [
            v
            for v in views.values()
            if v.state in (podlib.PodState.PENDING, podlib.PodState.RUNNING)
            and v.name not in self._chosen_to_leave
        ]
        for _ in range(desired - len(live)):
            pod = podlib.worker_pod(
                body, spec, rendezvous_url=self._settings.rendezvous_url, avoid_nodes=blacklisted
            )
            created = await self._api.create_pod(self.namespace, pod)
            self.pods_created += 1
            self._pods[created["metadata"]["name"]] = created
        if len(live) > desired:
            for view in podlib.newest_first(live, len(live) - desired):
                self._chosen_to_leave[view.name] = now
                await self._api.event(
                    self.namespace, dict(body), "ScalingIn", f"pod {view.name} leaves the job"
                )
        for name, since in list(self._chosen_to_leave.items()):
            leaving = views.get(name)
            if leaving is None:
                del self._chosen_to_leave[name]
            elif leaving.state is podlib.PodState.PENDING:
                await self.delete_pod(name)
            elif now - since > self._settings.removal_deadline_s and name not in self._deleted:
                logger.warning("job %s: pod %s did not leave in time", self.job_id, name)
                self._fail_pod(leaving, "did not leave in time", exit_code=1)
                await self.delete_pod(name, grace_s=0)

    def _observe(
        self,
        spec: ElasticJobSpec,
        views: Mapping[str, podlib.PodView],
        blacklisted: Mapping[str, float],
    ) -> Observation:
        driver = self.driver
        assert driver is not None
        ranks: dict[str, list[int]] = {}
        for worker, slot in driver.slots.items():
            ranks.setdefault(worker.hostname, []).append(slot.rank)
        states = [v.state for v in views.values() if v.name not in self._chosen_to_leave]
        wall = time.time() - time.monotonic()
        return Observation(
            driver_phase=driver.phase,
            result=driver.result,
            recovering=driver.recovering,
            desired=max(spec.min_replicas, min(spec.replicas, spec.max_replicas)),
            live=states.count(podlib.PodState.RUNNING),
            pending=states.count(podlib.PodState.PENDING),
            leaving=len(self._chosen_to_leave)
            + sum(v.state is podlib.PodState.LEAVING for v in views.values()),
            round=driver.round,
            world_size=len(driver.slots),
            workers=[
                {"pod": pod, "node": views[pod].node if pod in views else None, "ranks": sorted(r)}
                for pod, r in sorted(ranks.items())
            ],
            blacklisted_nodes=[
                {"node": node, "until": _rfc3339(until + wall)}
                for node, until in sorted(blacklisted.items())
            ],
            reset_count=driver.registry.reset_count,
            last_reset_reason=driver.last_reset_reason,
            progress=None
            if driver.progress is None
            else {
                "epoch": driver.progress.epoch,
                "step": driver.progress.step,
                "samplesPerSecond": driver.progress.samples_per_second,
            },
            extra={"noticeSeq": driver.rendezvous.round_info().latest_notice_seq},
        )

    async def _write_status(self, body: Mapping[str, Any], obs: Observation) -> None:
        previous = dict(body.get("status") or {})
        status = status_of(
            obs, previous, worker_selector(self.name), datetime.datetime.now(datetime.UTC)
        )
        self.phase = Phase(status["phase"])
        comparable = {k: v for k, v in status.items() if k != "conditions"}
        if comparable == self._last_status and obs.result is None:
            return
        self._last_status = comparable
        await self._api.patch_status(self.namespace, self.name, status)

    async def _finish(
        self, body: Mapping[str, Any], spec: ElasticJobSpec, result: JobResult
    ) -> None:
        reason = "Succeeded" if result.success else "Failed"
        await self._api.event(
            self.namespace, dict(body), reason, result.message, warning=not result.success
        )
        views = [podlib.view(p) for p in self._pods.values()]
        await self._write_status(body, self._observe(spec, {v.name: v for v in views}, {}))
        policy = spec.clean_pod_policy.value
        for view in views:
            running = view.state in (podlib.PodState.PENDING, podlib.PodState.RUNNING)
            if policy == "All" or (policy == "Running" and running):
                await self.delete_pod(view.name)


def _rfc3339(epoch_s: float) -> str:
    moment = datetime.datetime.fromtimestamp(epoch_s, datetime.UTC).replace(microsecond=0)
    return moment.isoformat().replace("+00:00", "Z")
