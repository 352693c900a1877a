"""The rendezvous service's transport end to end on devcluster: with the chart's defaults the
operator serves its rendezvous over TLS with a certificate it makes and keeps, workers verify it
(host name included, resolved by the cluster's DNS) and train to the end, plain HTTP to the
port gets nothing, and after a ``helm upgrade`` that rolls both operator replicas while the job
trains the same CA still verifies the new ones, which take the job's round over.
A certificate the cluster admin provides (``rendezvous.tls.secretName``) is served instead.

No CNI here enforces NetworkPolicy: the chart's policy is tested as rendered, in
tests/e2e/test_helm_chart.py.
"""

from __future__ import annotations

import base64
import datetime
import http.client
import json
import ssl
import urllib.request
from pathlib import Path

import pytest

from devcluster.cluster import Cluster
from elasticjob.operator.certs import TLSMaterial, service_dns_names
from elasticjob.worker_contract import ENV_RENDEZVOUS_CA, ENV_RENDEZVOUS_URL
from tests.support.elastic_jobs import (
    epoch_ended,
    job_manifest,
    reader_token,
    stop_workers,
    wait_status,
    worker_env,
    worker_pods,
)
from tests.support.job_runs import read_events
from tests.support.kube import Kube
from tests.support.operator_release import (
    CHART,
    RELEASE,
    RENDEZVOUS_HOST,
    RENDEZVOUS_PORT,
    SYSTEM_NS,
    about,
    both_replicas_ready,
    operator_ip,
    operator_log,
    operator_pods,
    ready_operator_pods,
    rendezvous_status,
    running_operator_pods,
)

TLS_SECRET = f"{RELEASE}-rendezvous-tls"


def kept_ca(kube: Kube) -> str:
    """The CA certificate the operator keeps in its Secret."""
    secret = kube.cluster.kubectl("-n", SYSTEM_NS, "get", "secret", TLS_SECRET, "-o", "json")
    data = json.loads(secret.stdout).get("data") or {}
    assert set(data) == {"tls.crt", "tls.key", "ca.crt"}, f"{TLS_SECRET} holds {set(data)}"
    return base64.b64decode(data["ca.crt"]).decode()


def another_ca() -> str:
    """A CA other than the operator's: the server must not verify with it."""
    other = TLSMaterial.issue([RENDEZVOUS_HOST], now=datetime.datetime.now(datetime.UTC))
    return other.ca_pem.decode()


@pytest.mark.timeout(900)
def test_a_job_trains_over_verified_tls_through_a_helm_upgrade_and_plain_http_gets_nothing(
    operator: Cluster, kube: Kube, tmp_path: Path
) -> None:
    """A job trains over TLS; ``helm upgrade`` then rolls both operator replicas while it
    trains: the new ones serve the kept certificate, take the round over (same round, no
    reset, no worker pod or process restarted), and the job trains on to its end."""
    log_dir, stop_file = tmp_path / "events", tmp_path / "stop"
    kube.apply(job_manifest("tls", log_dir, stop_file, replicas=2, minReplicas=2))
    try:
        running = wait_status(
            kube,
            "tls",
            "2 workers training over TLS",
            lambda s: s.get("phase") == "Running" and s.get("worldSize") == 2,
            timeout=180,  # the module's first job: cold imports on a loaded machine
        )
        env = worker_env(kube, "tls")
        assert env[ENV_RENDEZVOUS_URL] == f"https://{RENDEZVOUS_HOST}:{RENDEZVOUS_PORT}"
        ca = env[ENV_RENDEZVOUS_CA]
        assert ca.startswith("-----BEGIN CERTIFICATE-----")
        assert ca == kept_ca(kube), "workers get the CA the operator keeps"

        token = reader_token(kube, "tls")
        path = f"/v1/jobs/{kube.ns}.tls/round"
        assert rendezvous_status(kube, path, token, ca) == 200
        for host in (RENDEZVOUS_HOST, f"{RENDEZVOUS_HOST}.cluster.local", RELEASE):
            assert rendezvous_status(kube, path, token, ca, host=host) == 200, host
        with pytest.raises(ssl.SSLCertVerificationError, match="match"):
            rendezvous_status(kube, path, token, ca, host=f"other.{SYSTEM_NS}.svc")
        with pytest.raises(ssl.SSLCertVerificationError, match="local issuer"):
            rendezvous_status(kube, path, token, another_ca())
        ip = operator_ip(kube)
        with pytest.raises((OSError, http.client.HTTPException)):
            urllib.request.urlopen(f"http://{ip}:{RENDEZVOUS_PORT}{path}", timeout=10)

        # `helm upgrade` keeps what the operator wrote into the chart's Secret: the new
        # operator pods serve the kept certificate, the workers' CA verifies it, and they
        # report progress to them.
        kube.wait(
            "an epoch trained",
            lambda: any(e["ev"] == "epoch_end" for e in read_events(log_dir)),
            timeout=120,
        )
        before = read_events(log_dir)
        pods = worker_pods(kube, "tls")
        old = {p["metadata"]["name"] for p in operator_pods(operator)}
        both_replicas_ready(kube)
        upgrade(operator, "logLevel=info")  # a new pod template: both replicas roll
        kube.wait(
            "both replicas replaced",
            lambda: (
                not old & running_operator_pods(operator)
                and len(ready_operator_pods(operator)) == 2
            ),
            timeout=300,
        )
        leader = both_replicas_ready(kube)
        assert kept_ca(kube) == ca
        assert rendezvous_status(kube, path, token, ca) == 200
        at = epoch_ended(log_dir)
        trained_on = wait_status(
            kube,
            "tls",
            "progress reported to the new operator",
            lambda s: (s.get("progress") or {}).get("epoch", -1) > at,
        )
        assert trained_on["round"] == running["round"], "every leader adopted the round"
        assert trained_on["resetCount"] == running["resetCount"], trained_on
        assert worker_pods(kube, "tls") == pods, "no worker pod or process restarted"
        restarts = [
            e for e in read_events(log_dir) if e["ev"] == "start" and e["time"] > before[-1]["time"]
        ]
        assert not restarts, "workers must not restart with the operator"
        assert "resumed round" in about(kube, operator_log(operator, leader["metadata"]["name"]))

        stop_file.touch()
        wait_status(kube, "tls", "success", lambda s: s.get("phase") == "Succeeded", 180)
        finals = [e for e in read_events(log_dir) if e["ev"] == "done"]
        assert len(finals) == 2 and len({e["digest"] for e in finals}) == 1, finals
    finally:
        stop_workers(kube, log_dir)


def test_a_provided_certificate_is_served_and_its_ca_handed_to_workers(
    operator: Cluster, kube: Kube, tmp_path: Path
) -> None:
    material = TLSMaterial.issue(
        service_dns_names(RELEASE, SYSTEM_NS), now=datetime.datetime.now(datetime.UTC)
    )
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": "provided-tls", "namespace": SYSTEM_NS},
        "data": material.secret_data(),
    }
    operator.kubectl("apply", "-f", "-", input=json.dumps(secret))
    upgrade(operator, "rendezvous.tls.secretName=provided-tls")
    log_dir, stop_file = tmp_path / "events", tmp_path / "stop"
    try:
        kube.apply(job_manifest("provided", log_dir, stop_file, replicas=2, minReplicas=2))
        wait_status(
            kube,
            "provided",
            "2 workers training",
            lambda s: s.get("phase") == "Running" and s.get("worldSize") == 2,
        )
        ca = worker_env(kube, "provided")[ENV_RENDEZVOUS_CA]
        assert ca == material.ca_pem.decode()
        path = f"/v1/jobs/{kube.ns}.provided/round"
        assert rendezvous_status(kube, path, reader_token(kube, "provided"), ca) == 200
        stop_file.touch()
        wait_status(kube, "provided", "success", lambda s: s.get("phase") == "Succeeded", 180)
    finally:
        stop_workers(kube, log_dir)
        upgrade(operator, "rendezvous.tls.secretName=")
        operator.kubectl("-n", SYSTEM_NS, "delete", "secret", "provided-tls", check=False)


def upgrade(cluster: Cluster, setting: str) -> None:
    """``helm upgrade`` of the module's release with one value changed; waits for the new
    operator pod to be ready."""
    result = cluster.helm(
        *("upgrade", RELEASE, str(CHART), "-n", SYSTEM_NS, "--reuse-values", "--set", setting),
        *("--wait", "--timeout", "120s"),
        check=False,
        timeout=180,
    )
    assert result.returncode == 0, f"helm upgrade failed:\n{result.stdout}\n{result.stderr}"
