"""What the operator process holds: the API client, the rendezvous service that serves every
job, the metrics endpoint, the job controllers and the nodes that are not ready."""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import kopf
from aiohttp import web

from elasticjob.operator.controller import ControllerSettings, JobController
from elasticjob.operator.kube import KubeApi, load_config
from elasticjob.operator.metrics import render_metrics
from elasticjob.operator.webhook import ServiceWebhookServer
from elasticjob.rendezvous.server import RendezvousService

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OperatorConfig:
    rendezvous_url: str
    """How worker pods reach this process's rendezvous service."""
    bind_address: str = "0.0.0.0"
    rendezvous_port: int = 8470
    metrics_port: int = 8471
    webhook: WebhookConfig | None = None
    """Serve the validating admission webhook (kopf manages its configuration object)."""


@dataclass(frozen=True)
class WebhookConfig:
    service: str
    """The operator's Service, which is also the name of the webhook configuration object."""
    namespace: str
    port: int = 8443
    cert_dir: Path = Path(tempfile.gettempdir()) / "elasticjob-webhook"


@dataclass
class OperatorRuntime:
    config: OperatorConfig
    controllers: dict[tuple[str, str], JobController] = field(default_factory=dict)
    not_ready_nodes: set[str] = field(default_factory=set)
    _api: KubeApi | None = None
    _service: RendezvousService | None = None
    _metrics: web.AppRunner | None = None

    @property
    def api(self) -> KubeApi:
        assert self._api is not None, "the operator has not started"
        return self._api

    @property
    def service(self) -> RendezvousService:
        assert self._service is not None, "the operator has not started"
        return self._service

    @property
    def controller_settings(self) -> ControllerSettings:
        return ControllerSettings(rendezvous_url=self.config.rendezvous_url)

    async def start(self, settings: kopf.OperatorSettings) -> None:
        """Connect to the API, serve rendezvous and metrics, tune kopf."""
        settings.posting.level = logging.WARNING
        settings.networking.request_timeout = 30
        settings.watching.server_timeout = 60
        settings.execution.max_workers = 8
        if self.config.webhook is not None:
            hook = self.config.webhook
            settings.admission.server = ServiceWebhookServer(
                service=hook.service,
                namespace=hook.namespace,
                bind_address=self.config.bind_address,
                port=hook.port,
                cert_dir=hook.cert_dir,
            )
            # kopf names the configuration and its webhooks after this (three or more labels).
            settings.admission.managed = f"{hook.service}.{hook.namespace}.svc"
        load_config()
        self._api = KubeApi()
        self._service = RendezvousService()
        await self._service.start(self.config.bind_address, self.config.rendezvous_port)
        app = web.Application()
        app.router.add_get("/metrics", self._serve_metrics)
        app.router.add_get("/healthz", self._serve_health)
        self._metrics = web.AppRunner(app, access_log=None)
        await self._metrics.setup()
        await web.TCPSite(self._metrics, self.config.bind_address, self.config.metrics_port).start()
        logger.info(
            "operator serving rendezvous on :%d and metrics on :%d",
            self.config.rendezvous_port,
            self.config.metrics_port,
        )

    async def stop(self) -> None:
        if self._service is not None:
            await self._service.stop()
        if self._metrics is not None:
            await self._metrics.cleanup()

    async def _serve_metrics(self, _request: web.Request) -> web.Response:
        body = render_metrics(self.controllers.values(), self.service.stats)
        return web.Response(text=body, content_type="text/plain", charset="utf-8")

    async def _serve_health(self, _request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "jobs": len(self.controllers)})
