"""The validating admission webhook's server: kopf's, with a certificate of the operator's own
CA (one every replica serves, kept in a Secret: ``certs.managed_material``), announced to the
API server as a Service (``<service>.<namespace>.svc``) rather than a URL."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import kopf

from elasticjob.operator.certs import TLSMaterial

SERVICE_PORT = 443


class ServiceWebhookServer(kopf.WebhookServer):
    """Serves kopf's admission handlers over HTTPS on ``bind_address:port`` and tells the API
    server to reach them through ``service`` in ``namespace`` (port 443)."""

    def __init__(
        self,
        *,
        service: str,
        namespace: str,
        bind_address: str,
        port: int,
        cert_dir: Path,
        material: TLSMaterial,
    ) -> None:
        certfile, keyfile = material.write_files(cert_dir, "webhook")
        super().__init__(
            addr=bind_address,
            port=port,
            certfile=certfile,
            pkeyfile=keyfile,
            cadata=material.ca_pem,
        )
        self._service = {"name": service, "namespace": namespace, "port": SERVICE_PORT}
        self.ca_bundle = base64.b64encode(material.ca_pem).decode("ascii")
        """The CA bundle this server announces (base64 PEM), as the API server stores it."""

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        async for config in super().__call__(fn):
            yield {"service": dict(self._service, path=""), "caBundle": config["caBundle"]}


def serves_this_server(configuration: Mapping[str, Any] | None, ca_bundle: str) -> bool:
    """Whether a ValidatingWebhookConfiguration (None: there is none) sends reviews to the
    server whose CA bundle is ``ca_bundle``: until kopf has written its webhooks there, the
    API server admits every ElasticJob unchecked."""
    webhooks = (configuration or {}).get("webhooks") or []
    return any((hook.get("clientConfig") or {}).get("caBundle") == ca_bundle for hook in webhooks)
