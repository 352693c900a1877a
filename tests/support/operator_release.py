"""The operator as the end-to-end tests install it with helm (its release, namespace and pods),
and how a test reaches it: its logs, its rendezvous port, a restart."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from devcluster.cluster import Cluster
from elasticjob.wire.protocol import PROTOCOL_HEADER, PROTOCOL_VERSION
from elasticjob.worker_contract import ENV_RENDEZVOUS_CA
from tests.support.elastic_jobs import reader_token, worker_env
from tests.support.kube import Kube

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "elasticjob-operator"
SYSTEM_NS = "elasticjob-system"
RELEASE = "elasticjob-operator"
RENDEZVOUS_HOST = f"{RELEASE}.{SYSTEM_NS}.svc"
RENDEZVOUS_PORT = 8470
OPERATOR_PODS = "app.kubernetes.io/name=elasticjob-operator"
POLL_S = 0.05
"""How often :func:`wait_handover` looks (each look is a few kubectl round trips)."""


WEBHOOK = f"{RELEASE}.{SYSTEM_NS}.svc"
"""The name of the operator's admission webhook configuration (it registers it at start)."""


class OperatorRelease:
    """The operator's helm release on the session's cluster, installed once for the tests that
    use it: each module finds it installed and serving, with its admission webhook, unless a
    test uninstalled the release on purpose (the e2e conftest runs those last). A test that
    wants no webhook has it removed for its duration only (:meth:`without_webhook`)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.installed = False

    def ensure(self) -> None:
        """Install the release, or wait until its operator serves; register the webhook again
        (by restarting the operator) if a test removed it without saying so."""
        if not self.installed:
            result = self.cluster.helm(
                *("install", RELEASE, str(CHART), "-n", SYSTEM_NS, "--create-namespace"),
                *("--set", "logLevel=debug", "--wait", "--timeout", "240s"),
                check=False,
                timeout=300,
            )
            assert result.returncode == 0, f"helm install failed:\n{result.stdout}\n{result.stderr}"
            self.installed = True
            return
        rollout = self.cluster.kubectl(
            *("-n", SYSTEM_NS, "rollout", "status", f"deployment/{RELEASE}", "--timeout=240s"),
            check=False,
            timeout=300,
        )
        assert rollout.returncode == 0, f"the operator is not ready:\n{rollout.stderr}"
        if not self.has_webhook():
            restart_operator(Kube(self.cluster, SYSTEM_NS))
            Kube(self.cluster, SYSTEM_NS).wait("the webhook registered", self.has_webhook, 120)

    def has_webhook(self) -> bool:
        """Whether the webhook configuration exists and holds webhooks (what sends the API
        server's reviews to the operator)."""
        found = self.cluster.kubectl(
            *("get", "validatingwebhookconfiguration", WEBHOOK),
            *("-o", "jsonpath={.webhooks[*].name}"),
            check=False,
        )
        return found.returncode == 0 and bool(found.stdout.strip())

    @contextmanager
    def without_webhook(self) -> Iterator[None]:
        """Jobs reach the operator unchecked while in this context: the webhook configuration
        is deleted, then created again as the operator had registered it (its webhooks, CA
        bundle and owner: uninstalling the release still garbage-collects it), which the
        operator, still serving its webhook, needs no restart for. Where the operator
        restarted meanwhile and registered it again itself, that one stays."""
        saved = self.cluster.kubectl(
            "get", "validatingwebhookconfiguration", WEBHOOK, "-o", "json"
        ).stdout
        delete_webhook(self.cluster)
        try:
            yield
        finally:
            if not self.has_webhook():
                # One left empty (an operator restarted, its webhooks not written yet) goes.
                delete_webhook(self.cluster)
                self.cluster.kubectl("create", "-f", "-", input=registered_again(saved))
            assert self.has_webhook(), "the webhook configuration was not created again"

    def uninstalled(self) -> None:
        """A test uninstalled the release (the next :meth:`ensure` installs it again)."""
        self.installed = False

    def uninstall(self) -> None:
        """Uninstall the release and wait until no operator runs (it would still answer the
        webhook and the workers)."""
        self.cluster.helm("uninstall", RELEASE, "-n", SYSTEM_NS, check=False, timeout=60)
        Kube(self.cluster, SYSTEM_NS).wait(
            "no operator running", lambda: not running_operator_pods(self.cluster), timeout=150
        )
        self.installed = False


def operator_pods(cluster: Cluster) -> list[dict[str, Any]]:
    """The operator's pods (read in-process: tests poll them)."""
    return Kube(cluster, SYSTEM_NS).pods(OPERATOR_PODS)


def running_operator_pods(cluster: Cluster) -> set[str]:
    """The operator pods whose containers have not all exited. A deleted pod stays listed for
    10 s or more after its container exited (a 1.20 kubelet deletes it at its next batch of
    status updates), but it no longer answers anything."""
    return {p["metadata"]["name"] for p in operator_pods(cluster) if not _exited(p)}


def _exited(pod: dict[str, Any]) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return bool(statuses) and all("terminated" in (c.get("state") or {}) for c in statuses)


def leader_pod(cluster: Cluster) -> dict[str, Any] | None:
    """The operator pod the rendezvous Service routes to (the leader writes its address into
    the Service's EndpointSlice), not being deleted (None: there is none, or more than one)."""
    routed = serving_operator_pods(cluster)
    pods = [
        p
        for p in operator_pods(cluster)
        if p["metadata"]["name"] in routed and not p["metadata"].get("deletionTimestamp")
    ]
    return pods[0] if len(routed) == 1 and len(pods) == 1 else None


def serving_operator_pods(cluster: Cluster) -> set[str]:
    """The operator pods behind its rendezvous Service: the leader, once it routes the workers
    to itself (it writes its pod into the Service's EndpointSlice)."""
    found = cluster.kubectl(
        "-n", SYSTEM_NS, "get", "endpointslice", RELEASE, "-o", "json", check=False
    )
    if found.returncode != 0:  # none yet: it goes with the leader's pod, the next one makes it
        return set()
    endpoints = json.loads(found.stdout).get("endpoints") or []
    return {
        endpoint["targetRef"]["name"]
        for endpoint in endpoints
        if endpoint.get("targetRef")
        and (endpoint.get("conditions") or {}).get("ready") is not False
    }


def wait_operator_serving(kube: Kube, replaced: set[str]) -> None:
    """Wait until a new operator pod (none of ``replaced``) serves behind the Service: Running
    is not enough, since a starting operator registers its webhooks before it is ready."""
    kube.wait(
        "a new operator pod serving",
        lambda: serving_operator_pods(kube.cluster) - replaced,
        timeout=180,
    )


def ready_operator_pods(cluster: Cluster) -> list[dict[str, Any]]:
    """The operator pods that are ready and not being deleted."""
    return [
        p
        for p in operator_pods(cluster)
        if not p["metadata"].get("deletionTimestamp")
        and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p.get("status", {}).get("conditions", [])
        )
    ]


def replicas_on_two_nodes(kube: Kube) -> dict[str, Any]:
    """Wait until two replicas are ready on two nodes and one of them leads; the leader. The
    chart only prefers replicas on different nodes: replacements made while the replicas they
    replace still exist (terminating) can both land on the one node that has none. The standby
    is then deleted until its replacement lands on another node than the leader's."""
    for _ in range(3):
        leader = both_replicas_ready(kube)
        standby = next(
            p
            for p in ready_operator_pods(kube.cluster)
            if p["metadata"]["name"] != leader["metadata"]["name"]
        )
        if standby["spec"]["nodeName"] != leader["spec"]["nodeName"]:
            return leader
        deleted = {standby["metadata"]["name"]}
        kube.cluster.kubectl("-n", SYSTEM_NS, "delete", "pod", *deleted, "--wait=false")
        kube.wait(
            "the standby stopped",
            lambda deleted=deleted: not deleted & running_operator_pods(kube.cluster),
            timeout=120,
        )
    raise AssertionError("the operator's replicas kept landing on one node")


def both_replicas_ready(kube: Kube) -> dict[str, Any]:
    """Wait until two replicas are ready and one of them leads; the leader."""
    kube.wait(
        "two ready operator replicas",
        lambda: len(ready_operator_pods(kube.cluster)) == 2,
        timeout=180,
    )
    found: dict[str, Any] = kube.wait(
        "the operator's leader", lambda: leader_pod(kube.cluster), timeout=60
    )
    return found


def wait_handover(
    kube: Kube, job: str, since: float, *, old: str | None = None, timeout: float = 120
) -> tuple[str, float]:
    """Wait until the rendezvous Service routes to one pod (other than ``old``, when given)
    and that pod answers ``job``'s round (200); that pod, and the seconds from ``since``."""
    token, ca = reader_token(kube, job), worker_env(kube, job)[ENV_RENDEZVOUS_CA]
    path = f"/v1/jobs/{kube.ns}.{job}/round"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        serving = serving_operator_pods(kube.cluster)
        if len(serving) == 1 and old not in serving:
            (pod,) = serving
            found = kube.cluster.kubectl("-n", SYSTEM_NS, "get", "pod", pod, "-o", "json")
            ip = json.loads(found.stdout)["status"].get("podIP")
            try:
                answered = rendezvous_status(kube, path, token, ca, ip=ip) if ip else 0
            except OSError:
                answered = 0
            if answered == 200:
                return pod, time.monotonic() - since
        time.sleep(POLL_S)
    raise AssertionError(f"no operator served job {job} within {timeout:g} s (not {old})")


def restart_operator(kube: Kube) -> None:
    """Delete the operator's pod, wait until it no longer runs (a real kubelet may take most
    of its grace period on a loaded machine) and until its replacement serves."""
    old = {p["metadata"]["name"] for p in operator_pods(kube.cluster)}
    kube.cluster.kubectl("-n", SYSTEM_NS, "delete", "pod", "-l", OPERATOR_PODS, "--wait=false")
    kube.wait(
        "the old operator pod stopped",
        lambda: not old & running_operator_pods(kube.cluster),
        timeout=180,
    )
    wait_operator_serving(kube, old)


def operator_logs(cluster: Cluster, timeout: float = 60.0) -> str:
    """The logs of the operator's pods. The kubelet refuses a read while a container it
    restarted has no log yet: the read is tried again until ``timeout``, and the last
    refusal (kubectl's stderr) is what a timeout says."""
    deadline = time.monotonic() + timeout
    while True:
        found = cluster.kubectl(
            "-n",
            SYSTEM_NS,
            "logs",
            "-l",
            OPERATOR_PODS,
            "--tail=-1",
            "--all-containers",
            check=False,
        )
        if found.returncode == 0:
            return found.stdout
        if time.monotonic() > deadline:
            pods = [
                (p["metadata"]["name"], p.get("status", {}).get("containerStatuses"))
                for p in operator_pods(cluster)
            ]
            raise AssertionError(f"the operator's logs cannot be read: {found.stderr}\n{pods}")
        time.sleep(0.5)


def operator_ip(kube: Kube) -> str:
    """The IP of the operator pod that leads."""
    found = kube.wait("the operator's leader", lambda: leader_pod(kube.cluster), timeout=60)
    ip: str = found["status"]["podIP"]
    return ip


class _PinnedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to ``ip``, verifying the server as ``host`` (this machine does not resolve Service
    names; pods do: through the cluster's DNS on real nodes, hosts files on process nodes)."""

    def __init__(self, host: str, ip: str, port: int, context: ssl.SSLContext) -> None:
        super().__init__(host, port, timeout=10, context=context)
        self._ip = ip
        self._tls = context

    def connect(self) -> None:
        sock = socket.create_connection((self._ip, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(sock, server_hostname=self.host)


def rendezvous_status(
    kube: Kube,
    path: str,
    token: str,
    ca: str,
    *,
    host: str = RENDEZVOUS_HOST,
    ip: str | None = None,
) -> int:
    """The status of ``GET path`` on the rendezvous port of the operator at ``ip`` (None: the
    leader) over HTTPS, the server verified against ``ca`` as ``host``."""
    context = ssl.create_default_context(cadata=ca)
    conn = _PinnedHTTPSConnection(host, ip or operator_ip(kube), RENDEZVOUS_PORT, context)
    try:
        headers = {PROTOCOL_HEADER: str(PROTOCOL_VERSION)}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        conn.request("GET", path, headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


SERVER_SET_METADATA = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields")
"""What the API server sets in an object's metadata: left out of one created again."""


def registered_again(saved: str) -> str:
    """The object ``saved`` (JSON) as a create request: without what the API server set."""
    body = json.loads(saved)
    for key in SERVER_SET_METADATA:
        body["metadata"].pop(key, None)
    return json.dumps(body)


def delete_webhook(cluster: Cluster) -> None:
    cluster.kubectl("delete", "validatingwebhookconfiguration", WEBHOOK, check=False)


def operator_log(cluster: Cluster, pod: str, previous: bool = False) -> str:
    """The log of the operator's ``pod`` (``previous``: of its container's last run)."""
    args = ["-n", SYSTEM_NS, "logs", pod, *(["--previous"] if previous else [])]
    return cluster.kubectl(*args, check=False).stdout


def about(kube: Kube, log: str) -> str:
    """The lines of an operator's ``log`` about the test's namespace (the session's operator
    also logged the jobs of the tests before)."""
    return "\n".join(line for line in log.splitlines() if kube.ns in line)
