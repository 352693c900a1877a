"""The one owner of a job's worker pods: merges what the API server says of them into the
ledger (``pod_ledger``), carries each failure out (the driver hears of it first), plans the
pods (``scaling.plan_pods``) and carries the plan out, and pushes the usable pods to the
driver as its hosts the moment they change (``ElasticDriver.update_hosts``). The job's
controller runs a pass (:meth:`PodReconciler.reconcile`) whenever it is woken.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any, Final

from kubernetes.client.exceptions import ApiException

from elasticjob.driver.blacklist import BlacklistPolicy
from elasticjob.driver.driver import ElasticDriver
from elasticjob.driver.driver_types import Clock
from elasticjob.driver.job_record import EventKind, RecordEvent
from elasticjob.driver.journal_events import HealthChecked
from elasticjob.driver.worker_exits import ExitCause, ExitEffects, decide_exit
from elasticjob.operator import pods as podlib
from elasticjob.operator.adoption import Ownership, ownership
from elasticjob.operator.api import (
    LABEL_HEALTH_CHECK,
    BlacklistScope,
    ElasticJobSpec,
    HealthCheckSpec,
    worker_selector,
)
from elasticjob.operator.controller_settings import ControllerSettings
from elasticjob.operator.health_gate import HealthGate
from elasticjob.operator.job_events import JobEvents
from elasticjob.operator.job_secret import PodCredentials
from elasticjob.operator.kube import KubeApi
from elasticjob.operator.kube_errors import api_message, refused_for_now
from elasticjob.operator.pod_blacklist import PodBlacklist
from elasticjob.operator.pod_ledger import PodFailure, PodLedger, killed_reason
from elasticjob.operator.podmap import PodChange
from elasticjob.operator.pods import HealthLabel
from elasticjob.operator.scaling import PodPlan, plan_pods
from elasticjob.wire.messages import WorkerId
from elasticjob.worker_contract import EXIT_UNHEALTHY

logger = logging.getLogger(__name__)

LABEL_TIMEOUT_S: Final = 10.0
"""How long labelling a pod that passed its health check may take (tried again next pass)."""


class PodReconciler:
    """The worker pods of one job (see the module docstring)."""

    def __init__(
        self,
        namespace: str,
        name: str,
        api: KubeApi,
        settings: ControllerSettings,
        not_ready_nodes: set[str],
        wake: asyncio.Event,
        clock: Clock,
    ) -> None:
        """``wake``: set to have the controller run a pass soon."""
        self.namespace, self.name = namespace, name
        self.job_id = podlib.job_id(namespace, name)
        self._api = api
        self._settings = settings
        self._not_ready_nodes = not_ready_nodes
        self._wake = wake
        self._clock = clock
        self.job: Mapping[str, Any] | None = None
        """The ElasticJob's metadata (whose pods are its own), once known."""
        self.ledger = PodLedger(clock)
        self.events = JobEvents(BlacklistScope.NODE, wake.set)
        self._refused_for_now = False
        """Pod creates were refused for now (a quota), told once until one succeeds."""
        self.blacklist = PodBlacklist(
            BlacklistScope.NODE, BlacklistPolicy(), clock, self.ledger.node_of
        )
        self.slots = 1
        """Worker processes per pod: the spec's ``slotsPerWorker`` when the job started."""
        self.health = HealthGate(wake.set)
        """Its pods' health checks (``spec.healthCheck``)."""
        self._health_check: HealthCheckSpec | None = None
        """The health check when the job started (None: none): its pods are made with it,
        whatever the spec says later, as its rendezvous serves (or not) their checks."""
        self.rank_order: list[str] = []
        """The pods of an adopted round by rank (they keep their ranks)."""
        self._hosts: dict[str, int] = {}
        """The usable pods as last pushed to the driver."""
        self.driver: ElasticDriver | None = None
        self.credentials: PodCredentials | None = None
        """Where each new pod's credential is written (once the job's key is known)."""
        self.pods_created = 0
        self.pods_deleted = 0

    def configure(self, spec: ElasticJobSpec, credentials: PodCredentials) -> None:
        """The job starts with ``spec``: its blacklist and slots follow it; its pods'
        credentials are written by ``credentials``."""
        self.credentials = credentials
        scope, policy = spec.blacklist.scope, spec.blacklist.policy()
        self.blacklist = PodBlacklist(scope, policy, self._clock, self.ledger.node_of)
        self.events.scope = scope
        self.slots = spec.slots_per_worker
        self._health_check = spec.health_check

    def attach(self, driver: ElasticDriver) -> None:
        """``driver`` runs the job: it hears of the pods, and its journal of events (a
        resumed job's new driver hears of its hosts afresh)."""
        self.driver = driver
        self._hosts = {}
        self.rank_order = []
        driver.subscribe(self.events.on_journal)

    # ---- what the API server says ------------------------------------------------------

    def on_pod_event(self, event_type: str, pod: Mapping[str, Any]) -> None:
        """A watch event of a pod with the job's labels."""
        if not self._owns(pod):
            return  # it has the job's labels, not its ownerReference: not a worker
        self._merged(*self.ledger.merge_event(event_type, pod))

    def _merged(self, change: PodChange, vanished: list[PodFailure]) -> None:
        for failure in vanished:
            self.fail(failure)
        if change.changed:
            self._wake.set()

    async def relist(self) -> None:
        """Merge a fresh list of the job's pods: what the watch missed is caught up."""
        listed = await self._api.list_pods(self.namespace, worker_selector(self.name))
        owned = [pod for pod in listed.items if self._owns(pod)]
        self._merged(*self.ledger.merge_list(owned, listed.resource_version))

    def _owns(self, obj: Mapping[str, Any]) -> bool:
        return self.job is not None and ownership(obj, self.job) is Ownership.OWNED

    # ---- failures ----------------------------------------------------------------------

    def kill_pod(self, name: str, reason: str) -> None:
        """A worker of this pod stopped answering (``reason``), and the driver killed it: the
        pod fails at once (its exit is reported now; it is deleted on the next pass)."""
        self.fail(self.ledger.fail(name, ExitCause.KILLED, killed_reason(reason), 1))

    def fail(self, failure: PodFailure | None) -> None:
        """Carry a pod's failure out: the driver hears of its workers' ends and decides what
        follows (it blacklists and fails the round itself); the pod is then announced and
        deleted as the driver's effects say."""
        if failure is None:
            return
        logger.warning(
            "job %s: worker pod %s failed: %s", self.job_id, failure.name, failure.reason
        )
        effects = self._exit_workers(failure.name, failure.exit_code, failure.cause)
        if effects.announce:
            where = f"{failure.name} on {failure.node}"
            self.note(EventKind.WORKER_FAILED, f"{where}: {failure.reason}", failure.name, True)
        if effects.replace:
            self.ledger.delete_soon(failure.name, grace_s=0)
        self._wake.set()

    def note(self, kind: EventKind, message: str, pod: str, warning: bool) -> None:
        """Tell what was learnt of ``pod`` (``job_record.EventKind``): the driver records it,
        which makes its event; with no driver (the job is suspended) only the event."""
        if self.driver is not None:
            self.driver.note(kind, message, host=pod, warning=warning)
        else:
            event = RecordEvent(
                t=time.time(), kind=kind, message=message, host=pod, warning=warning
            )
            self.events.told(event)

    def _exit_workers(self, pod: str, exit_code: int, cause: ExitCause) -> ExitEffects:
        """Tell the driver that the workers of ``pod`` ended; return what follows (with no
        driver yet: the decision for a pod it never launched, less what only it does)."""
        if self.driver is None:
            return decide_exit(None, cause, exit_code, recovering=False)
        return ExitEffects.of_all(
            self.driver.on_worker_exit(WorkerId(pod, slot), exit_code, cause)
            for slot in range(self.slots)
        )

    async def delete_pod(self, name: str, grace_s: int | None = None) -> None:
        """Delete the pod ``name`` (``grace_s``: its grace period; None: the pod's own)."""
        if self.ledger.mark_deleted(name):
            self.pods_deleted += 1
        await self._api.delete_pod(self.namespace, name, grace_s)

    # ---- a pass ------------------------------------------------------------------------

    async def reconcile(
        self, body: Mapping[str, Any], spec: ElasticJobSpec
    ) -> dict[str, podlib.PodView]:
        """One pass over the pods: report those that ended, plan, carry the plan out; return
        the pods as this pass saw them."""
        now = self._clock()
        if self.ledger.pods.resync_due(waiting=len(self._hosts) < spec.replicas):
            await self.relist()  # the driver waits for hosts: a missed event may hide one
        views = await self._gate(now)
        for view in views.values():
            self._account(view)
        plan = plan_pods(
            spec,
            views,
            blacklisted=self.blacklist.active().keys(),
            leaving=self.ledger.draining,
            deleted=self.ledger.deleted,
            rank_order=self.rank_order,
            now=now,
            removal_deadline_s=self._settings.removal_deadline_s,
        )
        await self._carry_out(body, spec, plan, now)
        return views

    async def _gate(self, now: float) -> dict[str, podlib.PodView]:
        """Carry out the health checks' verdicts, fail the pods not judged in time, and return
        the pods as this pass sees them (a pod that passed is checked)."""
        if self._health_check is None:
            return self.ledger.views(self._not_ready_nodes)
        timeout_s = float(self._health_check.timeout_seconds)
        for heard in self.health.take_verdicts():
            seconds = heard.seconds
            if seconds is None:  # it never reported: the time the gate saw it run
                seconds = self.health.running_for(heard.pod, now)
            self._health_checked(heard.pod, heard.passed, heard.reason, seconds)
        views = self.health.observe(self.ledger.views(self._not_ready_nodes), now)
        overdue = self.health.overdue(views, now, timeout_s)
        for name in overdue:
            self._health_checked(name, False, f"no verdict within {timeout_s:g} s", timeout_s)
        if overdue:
            views = self.health.observe(self.ledger.views(self._not_ready_nodes), now)
        for name in self.health.to_label():
            try:
                await self._api.label_pod(
                    self.namespace, name, {LABEL_HEALTH_CHECK: HealthLabel.PASSED}, LABEL_TIMEOUT_S
                )
            except (ApiException, OSError) as exc:
                logger.warning("job %s: could not label pod %s: %s", self.job_id, name, exc)
                break  # the next pass tries again
            self.health.labelled(name)  # and its check is told it passed
        return views

    def _health_checked(self, pod: str, passed: bool, reason: str, seconds: float | None) -> None:
        """Tell the journal how a pod's health check ended; a pod that failed fails. Nothing
        for a pod whose end was carried out already (it failed, or is gone)."""
        if self.ledger.reported(pod) or pod in self.ledger.deleted:
            return
        if self.driver is not None:
            checked = HealthChecked(pod, self.ledger.node_of(pod), passed, reason, seconds)
            self.driver.health_checked(checked)
        if not passed:
            why = f"failed its health check: {reason}"
            self.fail(self.ledger.fail(pod, ExitCause.UNHEALTHY, why, EXIT_UNHEALTHY))

    def _account(self, view: podlib.PodView) -> None:
        """Report pods that ended to the driver, once each."""
        if view.state is podlib.PodState.FAILED:
            cause, code = ExitCause.EXITED, view.exit_code or 1
            self.fail(self.ledger.fail(view.name, cause, view.reason, code))
        elif view.state is podlib.PodState.SUCCEEDED and self.ledger.succeed(view.name):
            self._exit_workers(view.name, 0, ExitCause.EXITED)
            member = self.driver is not None and WorkerId(view.name, 0) in self.driver.slots
            if not member:  # the driver removed it (scale-in, drain): make room
                self.ledger.delete_soon(view.name, grace_s=None)
            # A member that succeeded finished training: it stays, as cleanPodPolicy says.

    async def _carry_out(
        self, body: Mapping[str, Any], spec: ElasticJobSpec, plan: PodPlan, now: float
    ) -> None:
        for name in plan.forget:
            self.ledger.forget(name)
        for name in plan.drain:
            self.ledger.drain(name, now)
            self.note(EventKind.LEAVING, f"{name} leaves the job", name, False)
        self._push_hosts(plan.hosts)
        avoid = self.blacklist.active() if spec.blacklist.scope is BlacklistScope.NODE else {}
        # No new pod for a job being suspended, or finishing (a new pod would only find the
        # job over: its members' pods that succeeded are not live, yet need no replacement).
        ending = self.driver is not None and (self.driver.suspending or self.driver.finishing)
        await self._create_pods(body, spec, 0 if ending else plan.create, avoid)
        for name in plan.delete:
            await self.delete_pod(name)
        for name in plan.overdue:
            logger.warning("job %s: pod %s did not leave in time", self.job_id, name)
            self.fail(self.ledger.fail(name, ExitCause.OVERDUE, "did not leave in time", 1))
        for name, grace_s in self.ledger.take_deletions():
            await self.delete_pod(name, grace_s)

    def _push_hosts(self, pods: Iterable[str]) -> None:
        """Tell the driver its hosts, the usable pods, when they changed."""
        hosts = dict.fromkeys(pods, self.slots)
        if hosts != self._hosts and self.driver is not None:
            self._hosts = hosts
            self.driver.update_hosts(hosts)

    async def _create_pods(
        self, body: Mapping[str, Any], spec: ElasticJobSpec, count: int, avoid: Iterable[str]
    ) -> None:
        """Create ``count`` worker pods at once (one API round trip, not ``count``), their
        credentials written first; the first error is raised once every create has
        answered."""
        if self.credentials is None:  # the job has not started (a suspended job's passes)
            assert count == 0, "a job makes pods once it runs"
            return
        names = [podlib.new_pod_name(self.name) for _ in range(count)]
        # Also removes the credentials of the pods gone since.
        await self.credentials.issue(names, self.ledger.pods.snapshot())
        spec = spec.model_copy(update={"health_check": self._health_check})
        pods = [
            podlib.worker_pod(
                body,
                spec,
                name,
                rendezvous_url=self._settings.rendezvous_url,
                rendezvous_ca=self._settings.rendezvous_ca,
                avoid_nodes=avoid,
            )
            for name in names
        ]
        answers = await asyncio.gather(
            *(self._api.create_pod(self.namespace, pod) for pod in pods), return_exceptions=True
        )
        for created in answers:
            if not isinstance(created, BaseException):
                self.pods_created += 1
                self._refused_for_now = False
                self._merged(*self.ledger.merge_event("ADDED", created))
        errors = [a for a in answers if isinstance(a, BaseException)]
        for_now = [e for e in errors if isinstance(e, ApiException) and refused_for_now(e)]
        if for_now and not self._refused_for_now:
            self._refused_for_now = True
            message = api_message(for_now[0])
            logger.warning("job %s: pods not created for now: %s", self.job_id, message)
            self.note(EventKind.CREATE_REFUSED, message, "", True)
        if others := [e for e in errors if e not in for_now]:
            raise others[0]
