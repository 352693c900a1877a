"""Fault injection, from Python (tests) and from the CLI.

``Cluster.faults`` comes from the cluster's node runtime
(:meth:`devcluster.noderuntime.NodeRuntime.faults`): this module's :class:`Faults` for process
nodes, :class:`devcluster.realfaults.RealFaults` (same methods, plus ``partition``/``heal``)
for real nodes.

The node agent owns the pod processes and the node heartbeats, so faults are
requests to its control endpoint, a Unix socket in the run directory:

- ``kill``/``stop``/``cont``: SIGKILL, SIGSTOP or SIGCONT a pod's container process(es);
- ``node_notready``/``node_ready``: stop and resume a node's heartbeats (its
  Lease and status), so the node-lifecycle controller marks it NotReady and
  evicts its pods after the configured toleration;
- ``node_delete``: the node disappears: its processes are killed, its pods
  removed and the Node object deleted; ``node_add`` registers it again;
- ``evict``: preemption notice: the pod gets the ``DisruptionTarget`` condition,
  then is deleted gracefully (SIGTERM, grace period, SIGKILL).
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
from typing import Any

from devcluster.config import ClusterConfig

logger = logging.getLogger(__name__)


class FaultError(RuntimeError):
    """The agent refused or failed a fault request."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self._path)
        self.sock = sock


class Faults:
    """Client of the node agent's control endpoint."""

    def __init__(self, config: ClusterConfig) -> None:
        self._config = config

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """Send a request to the agent and return its JSON answer."""
        conn = _UnixConnection(str(self._config.agent_socket), timeout=60.0)
        try:
            payload = json.dumps(body or {}).encode()
            conn.request(method, path, body=payload, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        answer = json.loads(data) if data else {}
        if resp.status >= 400:
            raise FaultError(answer.get("error", f"HTTP {resp.status}"))
        return answer

    def _signal(self, sig: str, pod: str, namespace: str, container: str | None) -> list[int]:
        body = {"namespace": namespace, "pod": pod, "container": container, "signal": sig}
        pids: list[int] = self.request("POST", "/faults/signal", body)["pids"]
        return pids

    def kill(self, pod: str, namespace: str = "default", container: str | None = None) -> list[int]:
        """SIGKILL the pod's container process(es); returns the pids signalled."""
        return self._signal("SIGKILL", pod, namespace, container)

    def stop(self, pod: str, namespace: str = "default", container: str | None = None) -> list[int]:
        """SIGSTOP the pod's container process groups (freeze)."""
        return self._signal("SIGSTOP", pod, namespace, container)

    def cont(self, pod: str, namespace: str = "default", container: str | None = None) -> list[int]:
        """SIGCONT the pod's container process groups (thaw)."""
        return self._signal("SIGCONT", pod, namespace, container)

    def node_notready(self, node: str, seconds: float | None = None) -> None:
        """Stop the node's heartbeats (for ``seconds``, or until :meth:`node_ready`)."""
        self.request("POST", "/faults/node", {"node": node, "action": "notready", "for": seconds})

    def node_ready(self, node: str) -> None:
        """Resume the node's heartbeats and report it Ready again."""
        self.request("POST", "/faults/node", {"node": node, "action": "ready"})

    def node_delete(self, node: str) -> None:
        """Kill the node's pods, remove them and delete the Node object."""
        self.request("POST", "/faults/node", {"node": node, "action": "delete"})

    def node_add(self, node: str) -> None:
        """Register a deleted node again."""
        self.request("POST", "/faults/node", {"node": node, "action": "add"})

    def evict(
        self, pod: str, namespace: str = "default", reason: str = "PreemptionByScheduler"
    ) -> None:
        """Preemption notice: DisruptionTarget condition, then graceful deletion."""
        self.request(
            "POST", "/faults/evict", {"namespace": namespace, "pod": pod, "reason": reason}
        )

    def partition(
        self,
        pod: str,
        namespace: str = "default",
        mode: str = "all",
        allow: list[str] | None = None,
    ) -> None:
        """Cut a pod's network (real nodes only: process nodes share the host's network)."""
        raise FaultError("partition needs real nodes (--runtime containerd)")

    def heal(self, pod: str, namespace: str = "default") -> None:
        """Undo :meth:`partition` (real nodes only)."""
        raise FaultError("heal needs real nodes (--runtime containerd)")

    def slow(
        self,
        pod: str,
        namespace: str = "default",
        cpus: float = 0.2,
        container: str | None = None,
    ) -> list[int]:
        """Throttle a pod's container(s) to ``cpus`` CPUs (real nodes only: process nodes'
        pods have no cgroup of their own)."""
        raise FaultError("slow needs real nodes (--runtime containerd)")

    def agent_status(self) -> dict[str, Any]:
        """Nodes and pods as the agent sees them."""
        status: dict[str, Any] = self.request("GET", "/status")
        return status
