"""Cluster DNS for real nodes: dnsmasq (Debian's dnsmasq-base) fed the cluster's Services.

Debian has no CoreDNS. Instead:

- **dnsmasq** listens on the host bridge's address (root namespace), port 53, answers from a
  hosts directory it watches with inotify (``--hostsdir``), is authoritative for
  ``cluster.local`` (unknown names there are NXDOMAIN) and forwards nothing;
- **the feeder** (``python -m devcluster.clusterdns --run-dir R``) lists and watches Services
  and Endpoints and rewrites that directory's file on every change:
  ``<svc>.<ns>.svc.cluster.local`` is the ClusterIP, or for a headless Service each ready
  endpoint's address (and ``<hostname>.<svc>.<ns>.svc.cluster.local`` for endpoints that
  have a hostname, as StatefulSet pods do);
- **a Service** ``kube-system/kube-dns`` with the kubelets' ``clusterDNS`` address as its
  ClusterIP and, having no selector, an Endpoints object naming dnsmasq's address: a pod's
  query goes to the ClusterIP and its node's kube-proxy forwards it, as on a real cluster.

The feeder also plays the node agent's other duty: when the cluster has an ``owner_pid`` (a
test session) and that process dies, it brings the cluster down.

The kubelets write ``search <ns>.svc.cluster.local svc.cluster.local cluster.local`` and
``options ndots:5`` into pods' resolv.conf, so ``svc``, ``svc.ns`` and the full name resolve.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from devcluster.agent.kubeapi import Api, Informer
from devcluster.config import MARKER_ENV, ClusterConfig, read_token
from devcluster.nodes import CLUSTER_DOMAIN

logger = logging.getLogger(__name__)

Obj = dict[str, Any]


def hosts_dir(cfg: ClusterConfig) -> Path:
    """The directory dnsmasq watches."""
    return cfg.run_dir / "dns"


def dnsmasq_argv(cfg: ClusterConfig) -> list[str]:
    """dnsmasq serving the hosts directory on the bridge address only."""
    return [
        "dnsmasq",
        "--keep-in-foreground",
        "--conf-file=/dev/null",
        "--pid-file",
        "--user=root",
        f"--listen-address={cfg.realnet.bridge_ip}",
        "--bind-interfaces",
        "--port=53",
        "--no-hosts",
        "--no-resolv",
        f"--hostsdir={hosts_dir(cfg)}",
        f"--local=/{CLUSTER_DOMAIN}/",
        "--local-ttl=1",
        "--log-facility=-",
    ]


def feeder_argv(cfg: ClusterConfig, python: str) -> list[str]:
    """The process that writes the Services into dnsmasq's hosts directory."""
    return [python, "-m", "devcluster.clusterdns", "--run-dir", str(cfg.run_dir)]


def dns_objects(cfg: ClusterConfig) -> list[Obj]:
    """The ``kube-system/kube-dns`` Service and its Endpoints (dnsmasq on the bridge)."""
    ports = [
        {"name": "dns", "port": 53, "protocol": "UDP"},
        {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
    ]
    meta = {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}}
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta,
            "spec": {"clusterIP": cfg.realnet.dns_service_ip, "ports": ports},
        },
        {
            "apiVersion": "v1",
            "kind": "Endpoints",
            "metadata": meta,
            "subsets": [{"addresses": [{"ip": cfg.realnet.bridge_ip}], "ports": ports}],
        },
    ]


def records(services: dict[str, Obj], endpoints: dict[str, Obj]) -> list[tuple[str, str]]:
    """(address, name) pairs for every Service: ClusterIP, or ready endpoints when headless."""
    found: list[tuple[str, str]] = []
    for key, svc in sorted(services.items()):
        ns, name = key.split("/", 1)
        fqdn = f"{name}.{ns}.svc.{CLUSTER_DOMAIN}"
        spec = svc.get("spec", {})
        cluster_ip = spec.get("clusterIP")
        if spec.get("type") == "ExternalName":
            continue
        if cluster_ip and cluster_ip != "None":
            found.append((cluster_ip, fqdn))
            continue
        for subset in endpoints.get(key, {}).get("subsets") or []:
            for address in subset.get("addresses") or []:
                found.append((address["ip"], fqdn))
                if address.get("hostname"):
                    found.append((address["ip"], f"{address['hostname']}.{fqdn}"))
    return found


class Feeder:
    """Keeps ``<hosts_dir>/services`` equal to :func:`records` of the watched objects."""

    def __init__(self, cfg: ClusterConfig) -> None:
        self.cfg = cfg
        self.api = Api(cfg.server, read_token(cfg, "admin"), str(cfg.pki_dir / "ca.crt"))
        self.services: dict[str, Obj] = {}
        self.endpoints: dict[str, Obj] = {}
        self.changed = asyncio.Event()

    def _handler(self, store: dict[str, Obj]) -> Any:
        async def handle(kind: str, obj: Obj) -> None:
            key = Informer.key(obj)
            if kind == "DELETED":
                store.pop(key, None)
            else:
                store[key] = obj
            self.changed.set()

        return handle

    def write(self) -> None:
        """Write the hosts file atomically (dnsmasq sees the rename)."""
        directory = hosts_dir(self.cfg)
        directory.mkdir(parents=True, exist_ok=True)
        lines = [f"{ip} {name}" for ip, name in records(self.services, self.endpoints)]
        tmp = directory.parent / "dns-services.tmp"
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(directory / "services")

    async def watch_owner(self) -> None:
        """When the cluster's owner process (a test session) dies, bring the cluster down.

        ``down`` runs in a new process outside the cluster (no marker variable), since it
        stops this one too.
        """
        owner = self.cfg.owner_pid
        if owner is None:
            return
        try:
            fd = os.pidfd_open(owner)
        except ProcessLookupError:
            fd = None
        if fd is not None:
            gone = asyncio.Event()
            loop = asyncio.get_running_loop()
            loop.add_reader(fd, gone.set)
            try:
                await gone.wait()
            finally:
                loop.remove_reader(fd)
                os.close(fd)
        logger.warning("owner process %d is gone: stopping the cluster", owner)
        env = {k: v for k, v in os.environ.items() if k != MARKER_ENV}
        argv = [sys.executable, "-m", "devcluster", "--run-dir", str(self.cfg.run_dir), "down"]
        with open(self.cfg.logs_dir / "owner-gone-down.log", "ab") as log:
            subprocess.Popen(
                argv, env=env, start_new_session=True, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    async def run(self) -> None:
        """Watch and rewrite until cancelled."""
        informers = [
            Informer(self.api, "/api/v1/services", self._handler(self.services)),
            Informer(self.api, "/api/v1/endpoints", self._handler(self.endpoints)),
        ]
        tasks = [asyncio.create_task(i.run()) for i in informers]
        tasks.append(asyncio.create_task(self.watch_owner()))
        try:
            while True:
                await self.changed.wait()
                self.changed.clear()
                if all(i.synced.is_set() for i in informers):
                    self.write()
        finally:
            for task in tasks:
                task.cancel()
            await self.api.close()


def main() -> None:
    """Entry point of the feeder process."""
    parser = argparse.ArgumentParser(description="feed cluster Services to dnsmasq")
    parser.add_argument("--run-dir", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(Feeder(ClusterConfig.load(args.run_dir)).run())


if __name__ == "__main__":
    main()
