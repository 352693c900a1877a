"""``elasticjob-operator``'s options for the rendezvous service's transport (the URL's scheme
decides), for the leader election and for the Service route the leader writes; options that do
not fit together are a usage error naming them."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest

from elasticjob.operator.certs import ManagedCertificate, TLSMaterial
from elasticjob.operator.leader_election import ElectionSettings
from elasticjob.operator.leader_lease import LeaseRef
from elasticjob.operator.main import (
    build_parser,
    leader_election,
    main,
    rendezvous_tls,
    service_route,
)
from elasticjob.operator.service_route import ServiceRoute

NOW = datetime.datetime.now(datetime.UTC)
ENV = {"ELASTICJOB_SERVICE_NAME": "ejo", "POD_NAMESPACE": "system"}
HTTPS = "https://ejo.system.svc:8470"


def options(*argv: str) -> object:
    return rendezvous_tls(build_parser().parse_args(argv), ENV)


@pytest.fixture
def mounted(tmp_path: Path) -> Path:
    material = TLSMaterial.issue(["ejo.system.svc", "ejo.system"], now=NOW)
    (tmp_path / "tls.crt").write_bytes(material.cert_pem)
    (tmp_path / "tls.key").write_bytes(material.key_pem)
    (tmp_path / "ca.crt").write_bytes(material.ca_pem)
    return tmp_path


def test_http_is_plain() -> None:
    assert options("--rendezvous-url", "http://ejo.system.svc:8470") is None


def test_https_with_a_managed_secret_names_every_service_name() -> None:
    assert options("--rendezvous-url", HTTPS, "--rendezvous-tls-secret", "ejo-tls") == (
        ManagedCertificate(
            secret="ejo-tls",
            namespace="system",
            dns_names=("ejo.system.svc", "ejo.system.svc.cluster.local", "ejo.system", "ejo"),
        )
    )


def test_a_url_host_outside_the_service_names_is_named_too() -> None:
    found = options(
        "--rendezvous-url", "https://rdzv.example:8470", "--rendezvous-tls-secret", "ejo-tls"
    )
    assert isinstance(found, ManagedCertificate)
    assert found.dns_names[-1] == "rdzv.example"


def test_https_with_a_mounted_certificate_that_covers_the_host(mounted: Path) -> None:
    found = options("--rendezvous-url", HTTPS, "--rendezvous-tls-dir", str(mounted))
    assert isinstance(found, TLSMaterial)
    assert found.ca_pem == (mounted / "ca.crt").read_bytes()


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--rendezvous-tls-secret", "s"], "--rendezvous-tls-secret needs an https"),
        (["--rendezvous-tls-dir", "/d"], "--rendezvous-tls-dir needs an https"),
        (["--rendezvous-url", HTTPS], "needs one of"),
        (
            [
                "--rendezvous-url",
                HTTPS,
                "--rendezvous-tls-secret",
                "s",
                "--rendezvous-tls-dir",
                "d",
            ],
            "needs one of",
        ),
        (["--rendezvous-url", "ftp://x:1"], "must be http"),
        (["--rendezvous-url", "https:///v1"], "must be http"),
    ],
    ids=["secret-http", "dir-http", "https-alone", "https-both", "scheme", "no-host"],
)
def test_options_that_do_not_fit_are_named(argv: list[str], error: str) -> None:
    if argv[0] != "--rendezvous-url":
        argv = ["--rendezvous-url", "http://ejo.system.svc:8470", *argv]
    with pytest.raises(ValueError, match=error):
        options(*argv)


def test_a_managed_secret_needs_the_service_name() -> None:
    args = build_parser().parse_args(["--rendezvous-url", HTTPS, "--rendezvous-tls-secret", "s"])
    with pytest.raises(ValueError, match="needs ELASTICJOB_SERVICE_NAME and POD_NAMESPACE"):
        rendezvous_tls(args, {"POD_NAMESPACE": "system"})


def test_a_mounted_certificate_for_another_host_is_refused(mounted: Path) -> None:
    with pytest.raises(ValueError, match=r"not valid for rdzv\.example .*ejo\.system\.svc, ejo"):
        options("--rendezvous-url", "https://rdzv.example", "--rendezvous-tls-dir", str(mounted))


def test_a_bad_option_is_a_usage_error_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--rendezvous-url", HTTPS, "--rendezvous-tls-dir", str(tmp_path)])
    assert code == 2
    assert "cannot read" in capsys.readouterr().err


def test_the_route_comes_from_the_downward_api_and_the_chart() -> None:
    pod = ENV | {"POD_NAME": "ejo-1", "POD_UID": "u-1", "POD_IP": "10.0.0.2"}
    route = ServiceRoute("system", "ejo", "ejo-1", "u-1", "10.0.0.2", 8470)
    assert service_route(pod, 8470) == route
    for missing in pod:
        without = {k: v for k, v in pod.items() if k != missing}
        assert service_route(without, 8470) is None, f"{missing} unset: nothing to route"


def test_without_a_lease_the_operator_leads_alone() -> None:
    assert leader_election(build_parser().parse_args(["--rendezvous-url", HTTPS]), ENV) is None


def test_the_lease_and_its_timing_come_from_the_options() -> None:
    args = build_parser().parse_args(
        ["--leader-election-lease", "ejo-leader", "--lease-duration", "5", "--retry-period", "1"]
    )
    election = leader_election(args, ENV)
    assert election is not None
    assert election.lease == LeaseRef("system", "ejo-leader")
    assert election.settings == ElectionSettings(5, ElectionSettings().renew_deadline_s, 1.0)


@pytest.mark.parametrize(
    ("argv", "env", "error"),
    [
        (["--leader-election-lease", "l"], {}, "needs POD_NAMESPACE"),
        (["--leader-election-lease", "l", "--renew-deadline", "3"], ENV, "lease duration >"),
    ],
    ids=["no-namespace", "deadline-past-the-duration"],
)
def test_an_election_that_cannot_work_is_refused(
    argv: list[str], env: dict[str, str], error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        leader_election(build_parser().parse_args(argv), env)
