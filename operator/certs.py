"""TLS certificates the operator serves with: its own small CA and a server certificate for
the operator's Service names, or a certificate the cluster admin provides.

The rendezvous service and the admission webhook both use :meth:`TLSMaterial.issue`. For the
rendezvous service the material must outlive the operator's pod (workers carry the CA in their
environment and keep training across an operator restart), so the operator keeps what it made
in a Secret of its own namespace (:func:`managed_material`), or reads a mounted one
(:meth:`TLSMaterial.from_directory`).
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import logging
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from elasticjob.operator.kube import KubeApi

logger = logging.getLogger(__name__)

CERT_KEY: Final = "tls.crt"
KEY_KEY: Final = "tls.key"
CA_KEY: Final = "ca.crt"
"""The keys of a ``kubernetes.io/tls`` Secret (``ca.crt`` as cert-manager writes it)."""
VALIDITY: Final = datetime.timedelta(days=3650)
"""How long a certificate the operator makes is valid."""
RENEW_BEFORE: Final = datetime.timedelta(days=30)
"""A kept certificate that expires within this is replaced at the operator's start."""


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The DNS names of a Service, the fully qualified in-cluster name first."""
    return [
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
        f"{service}.{namespace}",
        service,
    ]


@dataclass(frozen=True)
class TLSMaterial:
    """A server certificate (PEM), its private key (PEM) and the CA certificate (PEM) that
    clients verify it with."""

    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes

    @classmethod
    def issue(
        cls, dns_names: Sequence[str], ip: str | None = None, *, now: datetime.datetime
    ) -> TLSMaterial:
        """A new CA and a server certificate it signs for ``dns_names`` (and ``ip``), valid
        from a few minutes before ``now`` for :data:`VALIDITY`."""
        start, end = now - datetime.timedelta(minutes=5), now + VALIDITY
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{dns_names[0]} CA")])
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_usage(cert_sign=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
            .sign(ca_key, hashes.SHA256())
        )
        key = ec.generate_private_key(ec.SECP256R1())
        alternatives: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
        if ip:
            alternatives.append(x509.IPAddress(ipaddress.ip_address(ip)))
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_usage(cert_sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
            .sign(ca_key, hashes.SHA256())
        )
        pem = serialization.Encoding.PEM
        return cls(
            cert_pem=cert.public_bytes(pem),
            key_pem=key.private_bytes(
                pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            ),
            ca_pem=ca_cert.public_bytes(pem),
        )

    @classmethod
    def from_directory(cls, directory: Path) -> TLSMaterial:
        """The material of a mounted ``kubernetes.io/tls`` Secret with a ``ca.crt``.

        Raises :class:`ValueError` naming the file that is missing or not PEM."""
        parts: dict[str, bytes] = {}
        for key in (CERT_KEY, KEY_KEY, CA_KEY):
            path = directory / key
            try:
                parts[key] = path.read_bytes()
            except OSError as exc:
                raise ValueError(f"cannot read {path}: {exc.strerror}") from None
        return cls._from_parts(parts, str(directory))

    @classmethod
    def from_secret_data(cls, data: Mapping[str, str], where: str) -> TLSMaterial:
        """The material kept in a Secret's (base64) ``data``; :class:`ValueError` if a key is
        missing or not PEM."""
        missing = [k for k in (CERT_KEY, KEY_KEY, CA_KEY) if k not in data]
        if missing:
            raise ValueError(f"{where} has no {', '.join(missing)}")
        return cls._from_parts({k: base64.b64decode(data[k]) for k in data}, where)

    @classmethod
    def _from_parts(cls, parts: Mapping[str, bytes], where: str) -> TLSMaterial:
        material = cls(parts[CERT_KEY], parts[KEY_KEY], parts[CA_KEY])
        for key, pem in ((CERT_KEY, material.cert_pem), (CA_KEY, material.ca_pem)):
            try:
                x509.load_pem_x509_certificates(pem)
            except ValueError:
                raise ValueError(f"{where}: {key} is not a PEM certificate") from None
        try:
            serialization.load_pem_private_key(material.key_pem, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm):
            raise ValueError(f"{where}: {KEY_KEY} is not an unencrypted PEM private key") from None
        return material

    def secret_data(self) -> dict[str, str]:
        """The material as a Secret's (base64) ``data``."""
        return {
            key: base64.b64encode(pem).decode()
            for key, pem in (
                (CERT_KEY, self.cert_pem),
                (KEY_KEY, self.key_pem),
                (CA_KEY, self.ca_pem),
            )
        }

    @property
    def certificate(self) -> x509.Certificate:
        """The server certificate (the first of its chain)."""
        return x509.load_pem_x509_certificates(self.cert_pem)[0]

    def dns_names(self) -> list[str]:
        """The DNS names the server certificate is valid for."""
        try:
            names = self.certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        except x509.ExtensionNotFound:
            return []
        return names.value.get_values_for_type(x509.DNSName)

    def valid_for(self, host: str) -> bool:
        """Whether the server certificate names ``host`` (a ``*.`` name covers one label)."""
        _, _, parent = host.lower().partition(".")
        return any(
            name == host.lower() or (name.startswith("*.") and parent and name[2:] == parent)
            for name in map(str.lower, self.dns_names())
        )

    def server_context(self, directory: Path) -> ssl.SSLContext:
        """A server-side TLS context (TLS 1.2 or newer) with this certificate; the key goes to
        ``directory`` (``rendezvous.key``, mode 0600), since :mod:`ssl` loads keys from files
        only.

        Raises :class:`ssl.SSLError` when the key does not belong to the certificate."""
        certfile, keyfile = self.write_files(directory, "rendezvous")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(certfile, keyfile)
        return context

    def write_files(self, directory: Path, stem: str) -> tuple[Path, Path]:
        """Write the certificate and the key (mode 0600) as ``stem.crt``/``stem.key``."""
        directory.mkdir(parents=True, exist_ok=True)
        certfile, keyfile = directory / f"{stem}.crt", directory / f"{stem}.key"
        certfile.write_bytes(self.cert_pem)
        keyfile.touch(mode=0o600)
        keyfile.chmod(0o600)
        keyfile.write_bytes(self.key_pem)
        return certfile, keyfile


def _usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def still_serves(
    material: TLSMaterial | None, dns_names: Sequence[str], now: datetime.datetime
) -> bool:
    """Whether kept material still serves: it covers every name and is valid past
    ``now + RENEW_BEFORE``."""
    if material is None:
        return False
    certificate = material.certificate
    return (
        set(dns_names) <= set(material.dns_names())
        and certificate.not_valid_before_utc <= now
        and now + RENEW_BEFORE < certificate.not_valid_after_utc
    )


@dataclass(frozen=True)
class ManagedCertificate:
    """The operator makes a certificate (the rendezvous service's, or the admission webhook's)
    and keeps it in ``secret``, a Secret of ``namespace`` (the chart creates it empty; the
    operator fills it), so that it outlives the operator's pod and every replica serves it."""

    secret: str
    namespace: str
    dns_names: tuple[str, ...]
    purpose: str = "rendezvous"
    """What it serves (for logs)."""


_FILL_TRIES: Final = 3
"""Reads of a managed certificate's Secret at most: each replica that finds it empty makes
material and writes it at the version it read; all but the first get a conflict and read
again."""


async def managed_material(
    api: KubeApi, managed: ManagedCertificate, now: datetime.datetime
) -> TLSMaterial:
    """The kept material if it still serves (:func:`still_serves`), else new material, written
    to the Secret (at the version read: replicas starting together end with the same material)
    before it is used."""
    where = f"Secret {managed.namespace}/{managed.secret}"
    for _ in range(_FILL_TRIES):
        secret = await api.read_secret(managed.namespace, managed.secret)
        if secret is None:
            raise ValueError(f"{where} does not exist (the chart creates it)")
        data = dict(secret.get("data") or {})
        kept: TLSMaterial | None = None
        if data:
            try:
                kept = TLSMaterial.from_secret_data(data, where)
            except ValueError as exc:
                logger.warning("replacing the %s certificate: %s", managed.purpose, exc)
        if still_serves(kept, managed.dns_names, now):
            assert kept is not None
            logger.info("%s certificate from %s", managed.purpose, where)
            return kept
        if kept is not None:
            logger.warning(
                "the %s certificate in %s expires soon or does not cover %s: replacing it; "
                "clients that hold the old CA fail to reconnect",
                managed.purpose,
                where,
                ", ".join(managed.dns_names),
            )
        material = TLSMaterial.issue(managed.dns_names, now=now)
        version = str(secret["metadata"]["resourceVersion"])
        if await api.fill_secret(
            managed.namespace, managed.secret, material.secret_data(), version
        ):
            logger.info(
                "made a %s certificate for %s, kept in %s",
                managed.purpose,
                managed.dns_names[0],
                where,
            )
            return material
        logger.info("%s was filled by another replica meanwhile: reading it", where)
    raise RuntimeError(f"{where} kept changing while the operator read it")
