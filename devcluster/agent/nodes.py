"""Node objects: registration, heartbeats (Lease + status), pod address allocation."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform
from dataclasses import dataclass, field

from devcluster.agent.kubeapi import Api, ApiError, Obj
from devcluster.agent.status import micro_now, now
from devcluster.config import ClusterConfig
from elasticjob.event_waits import wait_event

logger = logging.getLogger(__name__)

STATUS_EVERY = 30.0
LEASE_NS = "kube-node-lease"


@dataclass
class Node:
    """One simulated node."""

    index: int
    name: str
    ip: str
    heartbeating: bool = True
    deleted: bool = False
    resume_at: float | None = None
    #: pod uid -> last octet of its address
    slots: dict[str, int] = field(default_factory=dict)

    def allocate(self, uid: str) -> str:
        """The pod's address, 127.<net>.<index>.<2..254>, stable per uid."""
        if uid not in self.slots:
            used = set(self.slots.values())
            free = next((n for n in range(2, 255) if n not in used), None)
            if free is None:
                raise RuntimeError(f"node {self.name} has no free pod address")
            self.slots[uid] = free
        prefix = self.ip.rsplit(".", 1)[0]
        return f"{prefix}.{self.slots[uid]}"

    def release(self, uid: str) -> None:
        """Free a pod's address."""
        self.slots.pop(uid, None)


class Nodes:
    """Registers the nodes and keeps them Ready."""

    def __init__(self, api: Api, cfg: ClusterConfig, kube_version: str) -> None:
        self._api = api
        self._cfg = cfg
        self._version = kube_version
        self.by_name = {
            cfg.node_name(i): Node(i, cfg.node_name(i), cfg.node_ip(i))
            for i in range(1, cfg.nodes + 1)
        }
        self._wake = asyncio.Event()

    def active(self, name: str) -> Node | None:
        """The node if it is ours and not deleted."""
        node = self.by_name.get(name)
        return node if node is not None and not node.deleted else None

    def _capacity(self) -> dict[str, str]:
        cfg = self._cfg
        cap = {
            "cpu": cfg.node_cpu,
            "memory": cfg.node_memory,
            "pods": str(cfg.node_pods),
            "ephemeral-storage": "100Gi",
            "hugepages-2Mi": "0",
        }
        cap.update(cfg.extended_resources)
        return cap

    def _status(self, node: Node) -> Obj:
        stamp = now()
        conds = [
            ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            ("PIDPressure", "False", "KubeletHasSufficientPID"),
            ("Ready", "True", "KubeletReady"),
        ]
        return {
            "capacity": self._capacity(),
            "allocatable": self._capacity(),
            "conditions": [
                {
                    "type": kind,
                    "status": value,
                    "reason": reason,
                    "message": "devcluster agent is posting ready status"
                    if kind == "Ready"
                    else reason,
                    "lastHeartbeatTime": stamp,
                    "lastTransitionTime": stamp,
                }
                for kind, value, reason in conds
            ],
            "addresses": [
                {"type": "InternalIP", "address": node.ip},
                {"type": "Hostname", "address": node.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self._cfg.kubelet_port}},
            "nodeInfo": {
                "machineID": f"devcluster-{node.name}",
                "systemUUID": f"devcluster-{node.name}",
                "bootID": f"devcluster-{os.getpid()}",
                "kernelVersion": platform.release(),
                "osImage": "devcluster (local processes)",
                "containerRuntimeVersion": "devcluster://0.1",
                "kubeletVersion": self._version,
                "kubeProxyVersion": self._version,
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    async def register(self, node: Node) -> None:
        """Create (or adopt) the Node and its Lease; report it Ready."""
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node.name,
                "labels": {
                    "kubernetes.io/hostname": node.name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "devcluster.elasticjob.dev/node": "true",
                },
            },
        }
        with contextlib.suppress(ApiError):
            await self._api.post("/api/v1/nodes", body)
        node.deleted = False
        await self.post_status(node)
        await self.renew_lease(node)

    async def post_status(self, node: Node) -> None:
        """Report the node's full status (Ready)."""
        await self._api.merge_patch(
            f"/api/v1/nodes/{node.name}/status", {"status": self._status(node)}
        )

    async def renew_lease(self, node: Node) -> None:
        """Renew the node's Lease (create it if missing)."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases/{node.name}"
        spec = {
            "holderIdentity": node.name,
            "leaseDurationSeconds": 40,
            "renewTime": micro_now(),
        }
        try:
            await self._api.merge_patch(path, {"spec": spec})
        except ApiError as err:
            if err.status != 404:
                raise
            await self._api.post(
                f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases",
                {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": node.name, "namespace": LEASE_NS},
                    "spec": spec,
                },
            )

    def set_heartbeat(self, name: str, on: bool, seconds: float | None = None) -> None:
        """Fault: stop (or resume) a node's heartbeats."""
        node = self.by_name[name]
        node.heartbeating = on
        loop = asyncio.get_running_loop()
        node.resume_at = loop.time() + seconds if (not on and seconds) else None
        self._wake.set()

    async def run(self) -> None:
        """Register every node, then heartbeat forever."""
        await asyncio.gather(*(self.register(n) for n in self.by_name.values()))
        loop = asyncio.get_running_loop()
        last_status = loop.time()
        while True:
            woken = await wait_event(self._wake, self._cfg.heartbeat_seconds)
            self._wake.clear()
            full = woken or loop.time() - last_status > STATUS_EVERY
            for node in self.by_name.values():
                resumed = node.resume_at is not None and loop.time() >= node.resume_at
                if resumed:
                    node.heartbeating, node.resume_at = True, None
                if node.deleted or not node.heartbeating:
                    continue
                try:
                    await self.renew_lease(node)
                    if full or resumed:
                        await self.post_status(node)
                except (TimeoutError, ApiError, OSError) as err:
                    logger.warning("heartbeat of %s failed: %r", node.name, err)
            if full:
                last_status = loop.time()
