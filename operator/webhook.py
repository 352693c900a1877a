"""The validating admission webhook's server: kopf's, with a self-signed certificate, and
announced to the API server as a Service (``<service>.<namespace>.svc``) rather than a URL."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

SERVICE_PORT = 443


def self_signed_certificate(
    directory: Path, dns_names: list[str], ip: str | None
) -> tuple[Path, Path, bytes]:
    """Write a key and a self-signed certificate for ``dns_names`` (and ``ip``) into
    ``directory``; return their paths and the certificate's PEM (the CA bundle)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])])
    alternatives: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    if ip:
        alternatives.append(x509.IPAddress(ipaddress.ip_address(ip)))
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    certfile, keyfile = directory / "webhook.crt", directory / "webhook.key"
    pem = certificate.public_bytes(serialization.Encoding.PEM)
    certfile.write_bytes(pem)
    keyfile.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    keyfile.chmod(0o600)
    return certfile, keyfile, pem


class ServiceWebhookServer(kopf.WebhookServer):
    """Serves kopf's admission handlers over HTTPS on ``bind_address:port`` and tells the API
    server to reach them through ``service`` in ``namespace`` (port 443)."""

    def __init__(
        self, *, service: str, namespace: str, bind_address: str, port: int, cert_dir: Path
    ) -> None:
        names = [
            f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.cluster.local",
            f"{service}.{namespace}",
            service,
        ]
        ip = bind_address if bind_address not in ("0.0.0.0", "::") else None
        certfile, keyfile, cadata = self_signed_certificate(cert_dir, names, ip)
        super().__init__(
            addr=bind_address, port=port, certfile=certfile, pkeyfile=keyfile, cadata=cadata
        )
        self._service = {"name": service, "namespace": namespace, "port": SERVICE_PORT}

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        async for config in super().__call__(fn):
            yield {"service": dict(self._service, path=""), "caBundle": config["caBundle"]}
