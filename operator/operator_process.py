"""What the operator process holds: the API client, the rendezvous service that serves every
job, the metrics endpoint, the job controllers (run by the job supervisor while this replica
leads), its side of the leader election, and the nodes that are not ready."""

from __future__ import annotations

import asyncio
import datetime
import logging
import socket
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import kopf
from aiohttp import web
from kubernetes.client.exceptions import ApiException

from elasticjob.driver.loop_lag import LoopLagWatch
from elasticjob.operator import pods as podlib
from elasticjob.operator.api.podschema import PodSchema
from elasticjob.operator.certs import (
    ManagedCertificate,
    TLSMaterial,
    managed_material,
    service_dns_names,
)
from elasticjob.operator.controller import JobController
from elasticjob.operator.controller_settings import ControllerSettings
from elasticjob.operator.finished_jobs import FinishedJobs, ended
from elasticjob.operator.kube import KubeApi
from elasticjob.operator.kube_transport import KubeTransport, load_config
from elasticjob.operator.leader_lease import LeaderElector, new_identity
from elasticjob.operator.leadership import OperatorLeadership
from elasticjob.operator.metrics import CONTENT_TYPE, OperatorMetrics
from elasticjob.operator.operator_config import OperatorConfig, WebhookConfig
from elasticjob.operator.ownpod import follow_own_pod
from elasticjob.operator.supervisor import JobSupervisor, StopSignal
from elasticjob.operator.webhook import ServiceWebhookServer, serves_this_server
from elasticjob.rendezvous.server import RendezvousService

logger = logging.getLogger(__name__)

ELECTION_THREADS: Final = 4
"""Threads of the election's API client (a read or write of the Lease, label changes)."""
ELECTION_CLOSE_S: Final = 15.0
"""How long a stopping operator waits for the election's step in progress (a stand-down
included) before it cancels it."""


@dataclass
class OperatorRuntime:
    config: OperatorConfig
    controllers: dict[tuple[str, str], JobController] = field(default_factory=dict)
    not_ready_nodes: set[str] = field(default_factory=set)
    jobs: JobSupervisor = field(init=False)
    pod_schema: PodSchema | None = None
    """The API server's Pod schema, for pod templates (None until fetched, or if it cannot
    be)."""
    rendezvous_ca: str | None = None
    """The CA certificate (PEM) workers verify the rendezvous service with (None: no TLS)."""
    stop_flag: asyncio.Event = field(default_factory=asyncio.Event)
    """Set to stop the operator (kopf's ``stop_flag``): its pod is being deleted."""
    reachable: bool = field(init=False)
    """Whether workers can reach the operator: its pod is ready (always, outside a pod)."""
    _api: KubeApi | None = None
    _service: RendezvousService | None = None
    _metrics: web.AppRunner | None = None
    metrics: OperatorMetrics = field(init=False)
    _own_pod_task: asyncio.Task[None] | None = None
    _webhook_server: ServiceWebhookServer | None = None
    _admission_registered: bool = False
    """Whether the API server has been seen sending reviews to this operator's webhook."""
    loop_lag: LoopLagWatch = field(default_factory=lambda: LoopLagWatch(time.monotonic))
    """The one watch of the event loop that every job's driver runs on."""
    leadership: OperatorLeadership = field(init=False)
    _elector: LeaderElector | None = None
    _election_task: asyncio.Task[None] | None = None
    _election_api: KubeApi | None = None
    """The election's own API client: one try a call, no urllib3 retries, threads of its own
    (a renewal never queues behind the jobs' calls)."""

    def __post_init__(self) -> None:
        finished = FinishedJobs(self._delete_job)
        self.jobs = JobSupervisor(
            self.run_job, updated=self._job_updated, leading=False, finished=finished
        )
        self.metrics = OperatorMetrics(self.controllers.values, lambda: self.service.stats)
        self.reachable = self.config.own_pod is None
        election = self.config.leader_election
        self.leadership = OperatorLeadership(
            lambda: self._election_api or self.api,
            lambda: self.service,
            self.jobs,
            self.config.service_route,
            namespaces=self.config.namespaces,
            stop_grace_s=None if election is None else election.settings.renew_deadline_s / 2,
            on_change=self.metrics.set_leading,
        )

    @property
    def api(self) -> KubeApi:
        assert self._api is not None, "the operator has not started"
        return self._api

    @property
    def service(self) -> RendezvousService:
        assert self._service is not None, "the operator has not started"
        return self._service

    @property
    def operator_namespace(self) -> str | None:
        """The namespace of the operator's own pod, where it runs no job (None: not known)."""
        return self.config.own_pod[0] if self.config.own_pod else None

    @property
    def controller_settings(self) -> ControllerSettings:
        return ControllerSettings(
            rendezvous_url=self.config.rendezvous_url,
            rendezvous_ca=self.rendezvous_ca,
            pod_schema=self.pod_schema,
            operator_namespace=self.operator_namespace,
            worker_network_policy=self.config.worker_network_policy,
        )

    async def start(self, settings: kopf.OperatorSettings) -> None:
        """Connect to the API, serve rendezvous and metrics, tune kopf."""
        settings.posting.level = logging.WARNING
        settings.networking.request_timeout = 30
        settings.watching.server_timeout = 60
        settings.execution.max_workers = 8
        load_config()
        self._api = KubeApi()
        hook = self.config.webhook
        if hook is not None:
            self._webhook_server = ServiceWebhookServer(
                service=hook.service,
                namespace=hook.namespace,
                bind_address=self.config.bind_address,
                port=hook.port,
                cert_dir=hook.cert_dir,
                material=await self._webhook_material(hook),
            )
            settings.admission.server = self._webhook_server
            settings.admission.managed = hook.configuration_name
        self.pod_schema = await self._fetch_pod_schema()
        if hook is not None and hook.owner is not None:
            await self._own_webhook_configurations(hook, hook.owner)
        self._service = RendezvousService()
        await self._service.start(
            self.config.bind_address,
            self.config.rendezvous_port,
            ssl_context=await self._rendezvous_ssl_context(),
        )
        await self._start_leading_or_standing_by()
        app = web.Application()
        app.router.add_get("/metrics", self._serve_metrics)
        self._metrics = web.AppRunner(app, access_log=None)
        await self._metrics.setup()
        await web.TCPSite(self._metrics, self.config.bind_address, self.config.metrics_port).start()
        if self.config.own_pod is not None:
            self._own_pod_task = asyncio.create_task(self._follow_own_pod(*self.config.own_pod))
        logger.info(
            "operator serving rendezvous (%s) on :%d and metrics on :%d",
            "https" if self.rendezvous_ca else "http",
            self.config.rendezvous_port,
            self.config.metrics_port,
        )

    async def _start_leading_or_standing_by(self) -> None:
        """Without an election: lead now (jobs that exist get 503 until served again). With
        one: stand by, and take part in the election."""
        election = self.config.leader_election
        if election is None:
            jobs = await self.api.list_jobs(self.config.namespaces)
            expected = [
                podlib.job_id(job["metadata"]["namespace"], job["metadata"]["name"])
                for job in jobs
                if not ended(job)
            ]
            await self.leadership.lead(expected)
            return
        self._election_api = KubeApi(
            KubeTransport(attempts=1, threads=ELECTION_THREADS, http_retries=False)
        )
        await self.leadership.start_standing_by()
        pod = self.config.own_pod[1] if self.config.own_pod else socket.gethostname()
        self._elector = LeaderElector(
            self._election_api,
            election.lease,
            new_identity(pod),
            election.settings,
            self.leadership,
            lambda: self.reachable and not self.stop_flag.is_set(),
        )
        self._election_task = asyncio.create_task(self._elector.run(), name="leader election")

    async def stop(self) -> None:
        """Stop serving: the election (releasing the Lease), the jobs, the services. The stop
        flag is set first, also when a signal stopped the operator: kopf waits 5 s for every
        task still running after its cleanup, its own wait on the flag included."""
        self.stop_flag.set()
        if self._own_pod_task is not None:
            self._own_pod_task.cancel()
        if self._elector is not None and self._election_task is not None:
            self._elector.close()  # its step ends first: never a stand-down cut short
            _, pending = await asyncio.wait({self._election_task}, timeout=ELECTION_CLOSE_S)
            for task in pending:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            await self._elector.release()
        await self.jobs.stop_all()
        if self._service is not None:
            await self._service.stop()
        if self._metrics is not None:
            await self._metrics.cleanup()

    async def _follow_own_pod(self, namespace: str, name: str) -> None:
        reason = await follow_own_pod(lambda: self.api.read_pod(namespace, name), self._ready)
        logger.error(
            "stopping: %s; the operator that replaces it drives the jobs (pod %s/%s)",
            reason,
            namespace,
            name,
        )
        self.stop_flag.set()
        if self._elector is not None:
            self._elector.poke()

    def _ready(self, ready: bool) -> None:
        """Whether the operator's pod is ready: workers reach it through its Service."""
        if ready == self.reachable:
            return
        self.reachable = ready
        if ready:
            logger.info("the operator's pod is ready: workers reach it again")
        else:
            logger.warning(
                "the operator's pod is not ready (its node may have stopped answering): "
                "workers cannot reach it, and their silence is not held against them"
            )
        for controller in self.controllers.values():
            controller.set_reachable(ready)
        if self._elector is not None:
            self._elector.poke()

    async def check_health(self) -> str:
        """What the health probe reports; raises when the operator cannot serve workers, or,
        with the webhook, until the API server sends it reviews (kopf registers the webhook
        after the operator has started: ready before that, a hostile ElasticJob applied just
        after ``helm install --wait`` would be admitted unchecked). Once seen, registration is
        not checked again: a configuration deleted later is the cluster admin's choice."""
        if self._service is None or not self._service.serving:
            raise RuntimeError("the rendezvous service is not serving")
        hook, server = self.config.webhook, self._webhook_server
        if hook is not None and server is not None and not self._admission_registered:
            name = hook.configuration_name
            found = await self.api.read_validating_webhook_configuration(name)
            if not serves_this_server(found, server.ca_bundle):
                raise RuntimeError(
                    f"the admission webhook is not registered yet: ValidatingWebhookConfiguration"
                    f" {name} does not send reviews to this operator"
                )
            self._admission_registered = True
            logger.info("the API server sends admission reviews to this operator (%s)", name)
        return "serving"

    async def _delete_job(self, namespace: str, name: str, uid: str) -> None:
        await self.api.delete_job(namespace, name, uid)

    def _job_updated(self, namespace: str, name: str) -> None:
        controller = self.controllers.get((namespace, name))
        if controller is not None:
            controller.job_updated()

    async def run_job(
        self, namespace: str, name: str, body: Mapping[str, Any], stopped: StopSignal
    ) -> None:
        """Run one ElasticJob's controller until the job ends or ``stopped`` is set."""
        controller = JobController(
            namespace,
            name,
            self.api,
            self.service,
            self.controller_settings,
            self.not_ready_nodes,
            reachable=self.reachable,
            observer=self.metrics.job_observer(podlib.job_id(namespace, name)),
            loop_lag=self.loop_lag,
        )
        self.controllers[(namespace, name)] = controller
        try:
            await controller.run(body, stopped)
        finally:
            self.controllers.pop((namespace, name), None)
            self.metrics.forget(controller.job_id)

    async def _rendezvous_ssl_context(self) -> ssl.SSLContext | None:
        """The rendezvous service's TLS context (None: plain HTTP); sets the CA for workers."""
        tls = self.config.rendezvous_tls
        if tls is None:
            return None
        if isinstance(tls, ManagedCertificate):
            tls = await managed_material(self.api, tls, datetime.datetime.now(datetime.UTC))
        self.rendezvous_ca = tls.ca_pem.decode()
        return tls.server_context(self.config.tls_dir)

    async def _webhook_material(self, hook: WebhookConfig) -> TLSMaterial:
        """The webhook's certificate: the one every replica keeps in ``hook.tls_secret``, or
        one made for this start."""
        now = datetime.datetime.now(datetime.UTC)
        names = tuple(service_dns_names(hook.service, hook.namespace))
        if hook.tls_secret is None:
            return TLSMaterial.issue(names, now=now)
        managed = ManagedCertificate(hook.tls_secret, hook.namespace, names, purpose="webhook")
        return await managed_material(self.api, managed, now)

    async def _fetch_pod_schema(self) -> PodSchema | None:
        try:
            return PodSchema.from_openapi(await self.api.openapi_v2())
        except (ApiException, OSError, ValueError) as exc:
            logger.warning(
                "no Pod schema from the API server (%s): pod templates are not checked for "
                "unknown fields",
                exc,
            )
            return None

    async def _own_webhook_configurations(self, hook: WebhookConfig, owner: str) -> None:
        """Best effort: without an owner the configurations outlive an uninstall."""
        try:
            owner_reference = {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "name": owner,
                "uid": await self.api.cluster_role_uid(owner),
            }
            await self.api.own_webhook_configurations(hook.configuration_name, owner_reference)
        except (ApiException, OSError) as exc:
            logger.warning(
                "could not make ClusterRole %s the owner of the webhook configurations %s (%s): "
                "they will outlive the operator's uninstall",
                owner,
                hook.configuration_name,
                exc,
            )
            return
        logger.info(
            "webhook configurations %s are owned by ClusterRole %s",
            hook.configuration_name,
            owner,
        )

    async def _serve_metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})
