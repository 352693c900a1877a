"""Faults on real nodes, under the names :class:`~devcluster.faults.Faults` uses for process nodes.

- ``kill``/``stop``/``cont``: SIGKILL, SIGSTOP or SIGCONT every process of the pod's
  container(s), through the node's containerd (``ctr tasks kill --all``);
- ``node_notready``/``node_ready``: stop and start the node's kubelet (its containers and
  kube-proxy go on running, as when a real kubelet dies); the node-lifecycle controller marks
  the node NotReady once its Lease expires;
- ``node_delete``: the node disappears: kubelet, kube-proxy, its containers and containerd are
  stopped, its pods deleted and the Node object removed; ``node_add`` starts it again and the
  kubelet registers it;
- ``evict``: preemption notice, as on process nodes: the ``DisruptionTarget`` condition (a
  1.20 control plane never sets it) then a graceful deletion, which the kubelet carries out;
- ``slow``: a CFS quota on the cpu cgroup of the pod's container(s) (cgroup v1), so its
  processes run on at a fraction of a CPU, as on an overloaded or throttled node;
- ``partition``/``heal``: iptables rules in the pod's own network namespace. Mode ``all``
  leaves only loopback; mode ``peers`` drops traffic to and from every other pod address
  (10.B.128.0/17) except the ``allow``-ed ones, while Services (the operator's ClusterIP), the
  API server and DNS stay reachable. The process keeps running and its sockets stay open: its
  packets vanish, as in a real network partition.
"""

from __future__ import annotations

import json
import logging
import subprocess
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from devcluster import controlplane as cp
from devcluster import nodeclean, procs
from devcluster.build import find_node_binaries
from devcluster.faults import FaultError, Faults
from devcluster.noderuntime import ProcessHost
from devcluster.nodes import RealNode, advertise_extended_resources, node_by_name

logger = logging.getLogger(__name__)

PARTITION_IN = "DEVCLUSTER-PARTITION-IN"
PARTITION_OUT = "DEVCLUSTER-PARTITION-OUT"
PARTITION_MODES = ("all", "peers")


class RealFaults(Faults):
    """Faults of a real-node cluster (same methods as the node agent's)."""

    def __init__(self, host: ProcessHost) -> None:
        super().__init__(host.config)
        self._host = host

    # ----- helpers -------------------------------------------------------
    def _pod(self, pod: str, namespace: str) -> dict[str, Any]:
        result = self._host.kubectl("-n", namespace, "get", "pod", pod, "-o", "json", check=False)
        if result.returncode != 0:
            raise FaultError(f"pod {namespace}/{pod}: {result.stderr.strip()}")
        obj: dict[str, Any] = json.loads(result.stdout)
        return obj

    def _containers(
        self, pod: str, namespace: str, container: str | None
    ) -> tuple[RealNode, list[str]]:
        """The pod's node and the containerd ids of its running container(s)."""
        obj = self._pod(pod, namespace)
        node_name = obj["spec"].get("nodeName")
        if not node_name:
            raise FaultError(f"pod {namespace}/{pod} is not scheduled")
        ids = [
            status["containerID"].split("://", 1)[1]
            for status in obj.get("status", {}).get("containerStatuses") or []
            if status.get("containerID")
            and "running" in status.get("state", {})
            and container in (None, status["name"])
        ]
        if not ids:
            raise FaultError(f"pod {namespace}/{pod} has no running container {container or ''}")
        return node_by_name(self._config, node_name), ids

    @staticmethod
    def _task_pids(node: RealNode, cid: str) -> list[int]:
        result = node.ctr("tasks", "ps", cid, timeout=30)
        return [int(line.split()[0]) for line in result.stdout.splitlines()[1:] if line.strip()]

    def _signal(self, sig: str, pod: str, namespace: str, container: str | None) -> list[int]:
        node, ids = self._containers(pod, namespace, container)
        pids: list[int] = []
        for cid in ids:
            pids += self._task_pids(node, cid)
            result = node.ctr("tasks", "kill", "--all", "--signal", sig, cid, timeout=30)
            if result.returncode != 0:
                raise FaultError(f"ctr tasks kill {cid}: {result.stderr.strip()}")
        return pids

    def slow(
        self,
        pod: str,
        namespace: str = "default",
        cpus: float = 0.2,
        container: str | None = None,
    ) -> list[int]:
        """Throttle the pod's container(s) to ``cpus`` CPUs: a CFS quota on their cpu cgroup
        (the period stays 100 ms). Returns the throttled processes' pids."""
        if not 0.01 <= cpus <= 64:
            raise FaultError(f"cpus must be within [0.01, 64], got {cpus}")
        node, ids = self._containers(pod, namespace, container)
        pids: list[int] = []
        for cid in ids:
            found = self._task_pids(node, cid)
            if not found:
                raise FaultError(f"container {cid} of pod {namespace}/{pod} has no process")
            group = _cpu_cgroup(found[0])
            (group / "cpu.cfs_period_us").write_text(f"{CFS_PERIOD_US}\n")
            (group / "cpu.cfs_quota_us").write_text(f"{round(cpus * CFS_PERIOD_US)}\n")
            logger.info("throttled %s/%s (%s) to %.2f CPUs", namespace, pod, group, cpus)
            pids += found
        return pids

    # ----- nodes ---------------------------------------------------------
    def node_notready(self, node: str, seconds: float | None = None) -> None:
        """Stop the node's kubelet (for ``seconds``, or until :meth:`node_ready`)."""
        target = node_by_name(self._config, node)
        self._host.stop_component(target.component("kubelet"))
        if seconds is not None:
            # Not a daemon: a CLI process waits for it before exiting.
            threading.Timer(seconds, self.node_ready, args=(node,)).start()

    def node_ready(self, node: str) -> None:
        """Start the node's kubelet (and kube-proxy, containerd) again if stopped."""
        target = node_by_name(self._config, node)
        running = self._host.running()
        if not running.get("kube-apiserver"):
            # The cluster went down before a timed node_notready ran out: start nothing.
            logger.info("%s stays down: the cluster is not running", node)
            return
        if not running.get(target.component("containerd")):
            self._host.spawn(target.component("containerd"), target.containerd_argv())
            cp.wait_for(f"containerd of {node}", target.containerd_ready, 30.0, lambda: None)
        bins = find_node_binaries(self._config.cache_dir, build=False)
        if not running.get(target.component("kubelet")):
            containerd = self._host.pid(target.component("containerd"))
            if containerd is None:
                raise FaultError(f"containerd of {node} is not running")
            argv = target.kubelet_argv(bins, containerd)
            self._host.spawn(target.component("kubelet"), argv)
        if not running.get(target.component("kube-proxy")):
            self._host.spawn(target.component("kube-proxy"), target.kube_proxy_argv(bins))

    def node_delete(self, node: str) -> None:
        """The node disappears: its processes and containers end, its pods and Node go."""
        target = node_by_name(self._config, node)
        for what in ("kubelet", "kube-proxy"):
            self._host.stop_component(target.component(what))
        nodeclean.kill_containers(self._config, [target])
        self._host.stop_component(target.component("containerd"))
        shims = [
            pid
            for pid in procs.marked_pids(self._config.run_dir)
            if str(target.socket).encode() in _cmdline(pid)
        ]
        procs.terminate(shims, 5.0)
        nodeclean.unmount_all(target.dir)
        self._host.kubectl(
            "delete", "pods", "--all-namespaces", "--field-selector", f"spec.nodeName={node}",
            "--grace-period=0", "--force", "--wait=false", check=False,
        )  # fmt: skip
        self._host.kubectl("delete", "node", node, "--wait=false")

    def node_add(self, node: str) -> None:
        """Start a deleted node again; its kubelet registers the Node, which then gets the
        cluster's extended resources advertised again."""
        self.node_ready(node)
        cp.wait_for(
            f"{node} registered",
            lambda: self._host.kubectl("get", "node", node, check=False).returncode == 0,
            60.0,
            lambda: None,
        )
        advertise_extended_resources(self._host, [node])

    # ----- pods ----------------------------------------------------------
    def evict(
        self, pod: str, namespace: str = "default", reason: str = "PreemptionByScheduler"
    ) -> None:
        """Preemption notice: DisruptionTarget condition, then graceful deletion."""
        obj = self._pod(pod, namespace)
        conditions = [
            c
            for c in obj.get("status", {}).get("conditions") or []
            if c["type"] != "DisruptionTarget"
        ]
        conditions.append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": reason,
                "message": "devcluster: the pod is being preempted",
                "lastProbeTime": None,
                "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        )
        patch = json.dumps({"status": {"conditions": conditions}})
        self._host.kubectl(
            "-n", namespace, "patch", "pod", pod, "--subresource=status", "--type=merge",
            "-p", patch,
        )  # fmt: skip
        self._host.kubectl("-n", namespace, "delete", "pod", pod, "--wait=false")

    def partition(
        self,
        pod: str,
        namespace: str = "default",
        mode: str = "all",
        allow: list[str] | None = None,
    ) -> None:
        """Cut the pod's network: ``all`` (only loopback) or ``peers`` (other pods, except
        the ``allow``-ed addresses). The pod keeps running."""
        if mode not in PARTITION_MODES:
            raise FaultError(f"mode must be one of {PARTITION_MODES}, not {mode!r}")
        netns = self._netns(pod, namespace)
        self._heal(netns)
        # Incoming packets are matched on their source, outgoing ones on their destination.
        for hook, chain, peer, iface in (
            ("INPUT", PARTITION_IN, "-s", "-i"),
            ("OUTPUT", PARTITION_OUT, "-d", "-o"),
        ):
            rules = [["-N", chain], ["-A", chain, iface, "lo", "-j", "ACCEPT"]]
            rules += [["-A", chain, peer, address, "-j", "ACCEPT"] for address in allow or []]
            if mode == "all":
                rules.append(["-A", chain, "-j", "DROP"])
            else:
                rules.append(["-A", chain, peer, self._config.realnet.pod_range, "-j", "DROP"])
            rules.append(["-I", hook, "-j", chain])
            for rule in rules:
                _iptables(netns, rule)

    def heal(self, pod: str, namespace: str = "default") -> None:
        """Undo :meth:`partition` (nothing to do if the pod is not partitioned)."""
        self._heal(self._netns(pod, namespace))

    @staticmethod
    def _heal(netns: str) -> None:
        for hook, chain in (("INPUT", PARTITION_IN), ("OUTPUT", PARTITION_OUT)):
            for rule in (["-D", hook, "-j", chain], ["-F", chain], ["-X", chain]):
                _iptables(netns, rule, check=False)

    def _netns(self, pod: str, namespace: str) -> str:
        """The pod's network namespace, as a /proc path of one of its processes."""
        node, ids = self._containers(pod, namespace, None)
        pids = self._task_pids(node, ids[0])
        if not pids:
            raise FaultError(f"pod {namespace}/{pod}: no process to find its network namespace")
        return f"/proc/{pids[0]}/ns/net"

    def agent_status(self) -> dict[str, Any]:
        """Real nodes have no agent: nodes and pods come from the API (``kubectl``)."""
        raise FaultError("real nodes have no node agent; use kubectl get nodes,pods")


def _iptables(netns: str, rule: list[str], check: bool = True) -> None:
    argv = ["nsenter", f"--net={netns}", "--", "iptables", "-w", *rule]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise FaultError(f"{' '.join(argv)}: {result.stderr.strip()}")


CFS_PERIOD_US = 100_000
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _cpu_cgroup(pid: int) -> Path:
    """The cgroup v1 cpu controller directory of process ``pid``."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError as exc:
        raise FaultError(f"process {pid}: {exc}") from exc
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            for mount in ("cpu,cpuacct", "cpu"):
                group = CGROUP_ROOT / mount / path.lstrip("/")
                if (group / "cpu.cfs_quota_us").exists():
                    return group
    raise FaultError(f"process {pid} has no cgroup v1 cpu controller")


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""
