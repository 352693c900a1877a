"""The operator's TLS certificates: what they are valid for, how long, and that a client that
trusts only their CA completes a real TLS handshake with the right host name and no other."""

from __future__ import annotations

import asyncio
import datetime
import ssl
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from elasticjob.operator.certs import (
    RENEW_BEFORE,
    VALIDITY,
    ManagedCertificate,
    TLSMaterial,
    managed_material,
    service_dns_names,
    still_serves,
)

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
NAMES = service_dns_names("ejo", "system")


@pytest.fixture(scope="module")
def material() -> TLSMaterial:
    return TLSMaterial.issue(NAMES, now=NOW)


def test_service_dns_names_are_every_name_of_the_service() -> None:
    assert NAMES == ["ejo.system.svc", "ejo.system.svc.cluster.local", "ejo.system", "ejo"]


def test_the_server_certificate_names_the_service_and_is_signed_by_the_ca(
    material: TLSMaterial,
) -> None:
    (ca,) = x509.load_pem_x509_certificates(material.ca_pem)
    cert = material.certificate
    assert material.dns_names() == NAMES
    cert.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]
    for c in (ca, cert):
        assert c.not_valid_before_utc == NOW - datetime.timedelta(minutes=5)
        assert c.not_valid_after_utc == NOW + VALIDITY


def test_an_ip_is_named_when_given() -> None:
    cert = TLSMaterial.issue(["a.b.svc"], "10.0.0.7", now=NOW).certificate
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.7"]


def test_every_issue_makes_a_new_ca(material: TLSMaterial) -> None:
    assert TLSMaterial.issue(NAMES, now=NOW).ca_pem != material.ca_pem


async def handshake(
    material: TLSMaterial, directory: Path, server_hostname: str, ca_pem: bytes
) -> None:
    """A TLS connection over loopback to a server with ``material``, from a client that
    trusts only ``ca_pem`` and expects ``server_hostname``."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(
        answer, "127.0.0.1", 0, ssl=material.server_context(directory)
    )
    port = server.sockets[0].getsockname()[1]
    try:
        client = ssl.create_default_context(cadata=ca_pem.decode())
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname=server_hostname),
            10,
        )
        assert await asyncio.wait_for(reader.read(), 10) == b"ok"
        writer.close()
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("name", NAMES)
async def test_a_client_trusting_the_ca_verifies_every_service_name(
    material: TLSMaterial, tmp_path: Path, name: str
) -> None:
    await handshake(material, tmp_path, name, material.ca_pem)
    assert (tmp_path / "rendezvous.key").stat().st_mode & 0o777 == 0o600


async def test_a_client_refuses_another_host_name(material: TLSMaterial, tmp_path: Path) -> None:
    with pytest.raises(ssl.SSLCertVerificationError, match=r"mismatch|doesn't match"):
        await handshake(material, tmp_path, "other.system.svc", material.ca_pem)


async def test_a_client_refuses_a_server_of_another_ca(
    material: TLSMaterial, tmp_path: Path
) -> None:
    other = TLSMaterial.issue(NAMES, now=NOW)
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
        await handshake(material, tmp_path, NAMES[0], other.ca_pem)


def test_a_key_of_another_certificate_is_refused(material: TLSMaterial, tmp_path: Path) -> None:
    other = TLSMaterial.issue(NAMES, now=NOW)
    mixed = TLSMaterial(material.cert_pem, other.key_pem, material.ca_pem)
    with pytest.raises(ssl.SSLError, match=r"KEY_VALUES_MISMATCH|key values mismatch"):
        mixed.server_context(tmp_path)


def test_secret_data_round_trips(material: TLSMaterial) -> None:
    assert TLSMaterial.from_secret_data(material.secret_data(), "Secret s") == material


def test_a_mounted_secret_is_read(material: TLSMaterial, tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_bytes(material.cert_pem)
    (tmp_path / "tls.key").write_bytes(material.key_pem)
    (tmp_path / "ca.crt").write_bytes(material.ca_pem)
    assert TLSMaterial.from_directory(tmp_path) == material


@pytest.mark.parametrize(
    ("files", "error"),
    [
        ({"tls.crt": "cert", "tls.key": "key"}, "cannot read .*ca.crt"),
        ({"tls.crt": "garbage", "tls.key": "key", "ca.crt": "cert"}, "tls.crt is not a PEM cert"),
        ({"tls.crt": "cert", "tls.key": "key", "ca.crt": "garbage"}, "ca.crt is not a PEM cert"),
        ({"tls.crt": "cert", "tls.key": "garbage", "ca.crt": "cert"}, "tls.key is not an unenc"),
    ],
    ids=["no-ca", "bad-cert", "bad-ca", "bad-key"],
)
def test_a_bad_mounted_secret_is_named(
    material: TLSMaterial, tmp_path: Path, files: dict[str, str], error: str
) -> None:
    content = {"cert": material.cert_pem, "key": material.key_pem, "garbage": b"not pem"}
    for name, what in files.items():
        (tmp_path / name).write_bytes(content[what])
    with pytest.raises(ValueError, match=error):
        TLSMaterial.from_directory(tmp_path)


def test_secret_data_without_a_key_is_named(material: TLSMaterial) -> None:
    data = material.secret_data()
    del data["ca.crt"]
    with pytest.raises(ValueError, match=r"Secret s has no ca\.crt"):
        TLSMaterial.from_secret_data(data, "Secret s")


DAY = datetime.timedelta(days=1)


@pytest.mark.parametrize(
    ("kept", "names", "now", "expected"),
    [
        (None, NAMES, NOW, False),
        ("fresh", NAMES, NOW, True),
        ("fresh", NAMES[:2], NOW + DAY, True),
        ("fresh", [*NAMES, "extra.example"], NOW, False),
        ("fresh", NAMES, NOW - DAY, False),
        ("fresh", NAMES, NOW + VALIDITY - RENEW_BEFORE - DAY, True),
        ("fresh", NAMES, NOW + VALIDITY - RENEW_BEFORE + DAY, False),
    ],
    ids=["none", "fresh", "subset", "missing-name", "not-yet-valid", "valid-long", "expiring"],
)
def test_kept_material_is_kept_while_it_covers_the_names_and_is_valid(
    material: TLSMaterial,
    kept: str | None,
    names: list[str],
    now: datetime.datetime,
    expected: bool,
) -> None:
    assert still_serves(material if kept else None, names, now) is expected


@pytest.mark.parametrize(
    ("names", "host", "expected"),
    [
        (["a.b.svc"], "a.b.svc", True),
        (["A.B.svc"], "a.b.SVC", True),
        (["a.b.svc"], "a.b", False),
        (["*.b.svc"], "a.b.svc", True),
        (["*.b.svc"], "x.a.b.svc", False),
        (["*.b.svc"], "b.svc", False),
    ],
)
def test_valid_for_matches_host_names_as_tls_clients_do(
    names: list[str], host: str, expected: bool
) -> None:
    assert TLSMaterial.issue(names, now=NOW).valid_for(host) is expected


class SecretStore:
    """The two Secret calls :func:`managed_material` makes, on one Secret held in memory (its
    version counts the writes; a write at another version is refused as a conflict)."""

    def __init__(self, data: dict[str, str] | None) -> None:
        self.data = data
        self.version = 1
        self.patches: list[dict[str, str]] = []

    async def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        assert (namespace, name) == (MANAGED.namespace, MANAGED.secret)
        if self.data is None:
            return None
        return {"metadata": {"resourceVersion": str(self.version)}, "data": dict(self.data)}

    async def fill_secret(
        self, namespace: str, name: str, data: dict[str, str], resource_version: str
    ) -> bool:
        assert (namespace, name) == (MANAGED.namespace, MANAGED.secret)
        await asyncio.sleep(0)  # another replica's read may come in between
        if resource_version != str(self.version):
            return False
        self.data, self.version = dict(data), self.version + 1
        self.patches.append(data)
        return True


MANAGED = ManagedCertificate(secret="ejo-tls", namespace="system", dns_names=tuple(NAMES))


@pytest.mark.parametrize(
    ("kept", "now", "outcome"),
    [
        ("valid", NOW, "kept"),
        ("empty", NOW, "made"),
        ("garbage", NOW, "made"),
        ("valid", NOW + VALIDITY - RENEW_BEFORE + DAY, "made"),
    ],
    ids=["valid", "empty", "garbage", "expiring"],
)
async def test_the_managed_certificate_is_kept_while_it_serves_else_made_and_stored(
    material: TLSMaterial, kept: str, now: datetime.datetime, outcome: str
) -> None:
    data = {
        "valid": material.secret_data(),
        "empty": {},
        "garbage": {"tls.crt": "eA==", "tls.key": "eA==", "ca.crt": "eA=="},
    }[kept]
    store = SecretStore(data)
    found = await managed_material(store, MANAGED, now)  # type: ignore[arg-type]
    if outcome == "kept":
        assert found == material and store.patches == []
    else:
        assert found != material and still_serves(found, NAMES, now)
        assert store.patches == [found.secret_data()], "stored before it is used"


async def test_a_missing_managed_secret_is_named() -> None:
    with pytest.raises(ValueError, match="Secret system/ejo-tls does not exist"):
        await managed_material(SecretStore(None), MANAGED, NOW)  # type: ignore[arg-type]


async def test_replicas_starting_together_end_with_the_same_managed_certificate() -> None:
    store = SecretStore({})
    found = await asyncio.gather(
        *(managed_material(store, MANAGED, NOW) for _ in range(3))  # type: ignore[arg-type]
    )
    assert found[0] == found[1] == found[2]
    assert len(store.patches) == 1 and store.patches[0] == found[0].secret_data()
