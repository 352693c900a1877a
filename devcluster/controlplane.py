"""Command lines of the control-plane processes and the checks that they are up.

All components listen on 127.0.0.1 only, except the API server of a real-node cluster: it
listens on the host bridge's address, the one address the nodes' network namespaces and the
pods behind them reach (see :class:`~devcluster.config.RealNet`). RBAC is on, clients
authenticate with static bearer tokens, and service-account tokens are signed with ``sa.key``.
The node-lifecycle settings make a NotReady node lose its pods in seconds.
"""

from __future__ import annotations

import json
import logging
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from devcluster.build import Binaries
from devcluster.config import ClusterConfig
from elasticjob.backoff import Backoff

logger = logging.getLogger(__name__)

_POLL = Backoff(initial_s=0.05, factor=1.5, max_s=0.5)
"""The pauses between the checks of :func:`wait_for`."""


def etcd_argv(cfg: ClusterConfig, bins: Binaries) -> list[str]:
    """etcd, single member, data under the run directory."""
    client = f"http://127.0.0.1:{cfg.etcd_port}"
    return [
        str(bins.etcd),
        "--name=devcluster",
        f"--data-dir={cfg.run_dir / 'etcd'}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls=http://127.0.0.1:{cfg.etcd_peer_port}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{cfg.etcd_peer_port}",
        f"--initial-cluster=devcluster=http://127.0.0.1:{cfg.etcd_peer_port}",
        "--log-level=warn",
        "--logger=zap",
        "--snapshot-count=50000",
    ]


def apiserver_argv(cfg: ClusterConfig, bins: Binaries) -> list[str]:
    """kube-apiserver with RBAC, token auth and signed service-account tokens."""
    pki = cfg.pki_dir
    tol = cfg.eviction_toleration_seconds
    return [
        str(bins.kube_apiserver),
        f"--etcd-servers=http://127.0.0.1:{cfg.etcd_port}",
        f"--bind-address={cfg.api_host}",
        f"--advertise-address={cfg.api_host}",
        f"--secure-port={cfg.apiserver_port}",
        f"--cert-dir={pki}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--token-auth-file={pki / 'tokens.csv'}",
        "--authorization-mode=Node,RBAC",
        "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={cfg.service_cidr}",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        f"--kubelet-certificate-authority={pki / 'ca.crt'}",
        "--kubelet-preferred-address-types=InternalIP",
        f"--default-not-ready-toleration-seconds={tol}",
        f"--default-unreachable-toleration-seconds={tol}",
        "--allow-privileged=true",
        # Reach Services (admission webhooks, aggregated APIs) through their endpoints'
        # addresses: process nodes have no kube-proxy, and on real nodes ClusterIPs are
        # translated in the nodes' namespaces only (the root namespace blackholes them).
        "--enable-aggregator-routing=true",
        "--profiling=false",
        "--enable-priority-and-fairness=false",
        "--v=1",
    ]


def controller_manager_argv(cfg: ClusterConfig, bins: Binaries) -> list[str]:
    """kube-controller-manager; NotReady nodes are noticed within a few seconds."""
    pki = cfg.pki_dir
    return [
        str(bins.kube_controller_manager),
        f"--kubeconfig={cfg.run_dir / 'controller-manager.kubeconfig'}",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        "--controllers=*,-nodeipam,-cloud-node-lifecycle",
        "--bind-address=127.0.0.1",
        f"--secure-port={cfg.controller_manager_port}",
        "--port=0",
        "--leader-elect=false",
        "--node-monitor-period=1s",
        f"--node-monitor-grace-period={cfg.node_monitor_grace_seconds}s",
        f"--pod-eviction-timeout={cfg.eviction_toleration_seconds}s",
        "--profiling=false",
        "--v=1",
    ]


def scheduler_argv(cfg: ClusterConfig, bins: Binaries) -> list[str]:
    """kube-scheduler."""
    return [
        str(bins.kube_scheduler),
        f"--kubeconfig={cfg.run_dir / 'scheduler.kubeconfig'}",
        "--bind-address=127.0.0.1",
        f"--secure-port={cfg.scheduler_port}",
        "--port=0",
        "--leader-elect=false",
        "--profiling=false",
        "--v=1",
    ]


def agent_argv(cfg: ClusterConfig) -> list[str]:
    """The node agent, run with the same interpreter as the caller."""
    return [sys.executable, "-m", "devcluster.agent", "--run-dir", str(cfg.run_dir)]


class ApiProbe:
    """Small synchronous HTTPS client for readiness checks."""

    def __init__(self, cfg: ClusterConfig, token: str) -> None:
        self._cfg = cfg
        self._token = token
        self._ctx = ssl.create_default_context(cafile=str(cfg.pki_dir / "ca.crt"))

    def get(self, path: str) -> tuple[int, bytes]:
        """GET ``path``; returns (status, body); status 0 when unreachable."""
        req = urllib.request.Request(
            self._cfg.server + path, headers={"Authorization": f"Bearer {self._token}"}
        )
        try:
            with urllib.request.urlopen(req, context=self._ctx, timeout=5) as resp:
                return int(resp.status), bytes(resp.read())
        except urllib.error.HTTPError as err:
            return int(err.code), err.read()
        except (OSError, ssl.SSLError):
            return 0, b""

    def get_json(self, path: str) -> dict[str, Any] | None:
        """GET ``path`` as JSON, or None if not 200."""
        status, body = self.get(path)
        if status != 200:
            return None
        result: dict[str, Any] = json.loads(body)
        return result


def wait_for(
    what: str, check: Callable[[], bool], timeout: float, alive: Callable[[], str | None]
) -> None:
    """Poll ``check`` until true; fail early if ``alive`` names a dead component, and once
    the next check would come after ``timeout``."""
    pauses = _POLL.until(time.monotonic() + timeout)
    while True:
        if check():
            return
        dead = alive()
        if dead:
            raise RuntimeError(f"{dead} exited while waiting for {what}")
        pause = pauses.next_pause()
        if pause is None:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(pause)


def etcd_healthy(cfg: ClusterConfig) -> bool:
    """True when etcd answers /health."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{cfg.etcd_port}/health", timeout=2) as r:
            return b'"true"' in r.read()
    except OSError:
        return False


def nodes_ready(probe: ApiProbe, names: list[str]) -> bool:
    """True when every named node has condition Ready=True."""
    nodes = probe.get_json("/api/v1/nodes")
    if nodes is None:
        return False
    ready = set()
    for node in nodes.get("items", []):
        for cond in node.get("status", {}).get("conditions") or []:
            if cond.get("type") == "Ready" and cond.get("status") == "True":
                ready.add(node["metadata"]["name"])
    return set(names) <= ready
