"""The node agent: plays the kubelet for every node of the cluster, in one process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from pathlib import Path
from typing import Any

from aiohttp import web

from devcluster import procs
from devcluster.agent import runner
from devcluster.agent.hosts import HostsFiles
from devcluster.agent.images import ImageResolver
from devcluster.agent.kubeapi import Api, ApiError, Informer, Obj
from devcluster.agent.nodes import Nodes
from devcluster.agent.pod import PodContext, PodWorker
from devcluster.agent.server import control_app, kubelet_app, kubelet_ssl
from devcluster.agent.status import now
from devcluster.config import ClusterConfig, read_token

logger = logging.getLogger(__name__)

SHUTDOWN_GRACE = 2.0
TERMINAL = ("Succeeded", "Failed")


class Agent:
    """Node registration, pod workers, hosts files and the HTTP endpoints."""

    def __init__(self, cfg: ClusterConfig, kube_version: str = "v1.20.2") -> None:
        self.cfg = cfg
        self.api = Api(cfg.server, read_token(cfg, "devcluster-agent"), str(cfg.pki_dir / "ca.crt"))
        self.nodes = Nodes(self.api, cfg, kube_version)
        self.hosts = HostsFiles()
        self.workers: dict[str, PodWorker] = {}
        self._node_of: dict[str, str] = {}
        self._event_tasks: set[asyncio.Task[None]] = set()
        self._orphaned = False
        base_env = {
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(cfg.apiserver_port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(cfg.apiserver_port),
            "KUBERNETES_PORT": f"tcp://127.0.0.1:{cfg.apiserver_port}",
            "DEVCLUSTER_RUN_DIR": str(cfg.run_dir),
        }
        self.ctx = PodContext(
            api=self.api,
            run_dir=cfg.run_dir,
            resolver=ImageResolver(cfg.run_dir, cfg.image_map),
            ns_prefix=runner.namespaces_supported(),
            base_env=base_env,
            event=self.event,
        )

    # ----- pods ----------------------------------------------------------
    async def on_pod(self, kind: str, pod: Obj) -> None:
        """Informer handler: start, update or stop pod workers."""
        meta, spec = pod["metadata"], pod.get("spec", {})
        uid = meta["uid"]
        worker = self.workers.get(uid)
        if kind == "DELETED":
            if worker is not None:
                worker.stop(worker.grace, delete=False)
            self._forget(uid)
            return
        if worker is not None:
            worker.update(pod)
            return
        node = self.nodes.active(spec.get("nodeName", ""))
        if node is None:
            return
        if meta.get("deletionTimestamp") or pod.get("status", {}).get("phase") in TERMINAL:
            if meta.get("deletionTimestamp"):
                await self._delete_now(pod)
            return
        ip = node.ip if spec.get("hostNetwork") else node.allocate(uid)
        worker = PodWorker(self.ctx, pod, node.ip, ip)
        self.workers[uid] = worker
        self._node_of[uid] = node.name
        fqdn = ""
        if spec.get("hostname") and spec.get("subdomain"):
            fqdn = f"{spec['hostname']}.{spec['subdomain']}.{meta['namespace']}.svc.cluster.local"
        self.hosts.add_pod(
            uid,
            worker.hosts_file,
            meta["namespace"],
            spec.get("hostname") or meta["name"],
            fqdn,
            ip,
        )
        worker.task.add_done_callback(lambda _t: self._worker_done(uid))

    def _worker_done(self, uid: str) -> None:
        self.hosts.remove_pod(uid)

    def _forget(self, uid: str) -> None:
        self.workers.pop(uid, None)
        self.hosts.remove_pod(uid)
        node = self.nodes.by_name.get(self._node_of.pop(uid, ""))
        if node is not None:
            node.release(uid)

    async def _delete_now(self, pod: Obj) -> None:
        meta = pod["metadata"]
        with contextlib.suppress(ApiError, OSError, asyncio.TimeoutError):
            await self.api.delete(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}},
            )

    def find_pod(self, namespace: str, name: str) -> PodWorker | None:
        """The newest worker of pod ``namespace/name``."""
        found = [w for w in self.workers.values() if (w.namespace, w.name) == (namespace, name)]
        return found[-1] if found else None

    def logs_dir(self, namespace: str, name: str) -> Path | None:
        """Log directory of the pod (also after it is gone)."""
        worker = self.find_pod(namespace, name)
        if worker is not None:
            return worker.dir / "logs"
        dirs = sorted(
            self.cfg.pods_dir.glob(f"{namespace}_{name}_*/logs"), key=lambda p: p.stat().st_mtime
        )
        return dirs[-1] if dirs else None

    def event(self, pod: Obj, kind: str, reason: str, message: str) -> None:
        """Record a kubelet-style Event for ``pod`` (fire and forget)."""
        meta = pod["metadata"]
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "source": {"component": "kubelet", "host": pod.get("spec", {}).get("nodeName", "")},
            "firstTimestamp": now(),
            "lastTimestamp": now(),
            "count": 1,
        }

        async def send() -> None:
            with contextlib.suppress(ApiError, OSError, asyncio.TimeoutError):
                await self.api.post(f"/api/v1/namespaces/{meta['namespace']}/events", body)

        task = asyncio.get_running_loop().create_task(send())
        self._event_tasks.add(task)
        task.add_done_callback(self._event_tasks.discard)

    # ----- faults --------------------------------------------------------
    async def fault_signal(
        self, namespace: str, pod: str, container: str | None, sig: str
    ) -> list[int]:
        """Send a signal to a pod's running container process groups."""
        worker = self.find_pod(namespace, pod)
        if worker is None:
            raise LookupError(f"pod {namespace}/{pod} does not run here")
        signum = signal.Signals[sig]
        pids = []
        for c in worker.containers(container):
            if c.proc is not None and "running" in c.state and runner.signal_group(c.proc, signum):
                pids.append(c.proc.pid)
        if not pids:
            raise LookupError(f"pod {namespace}/{pod} has no running container to signal")
        return pids

    async def fault_node(self, name: str, action: str, seconds: float | None) -> None:
        """notready / ready / delete / add."""
        if name not in self.nodes.by_name:
            raise LookupError(f"unknown node {name}")
        node = self.nodes.by_name[name]
        if action == "notready":
            self.nodes.set_heartbeat(name, False, seconds)
        elif action == "ready":
            self.nodes.set_heartbeat(name, True)
        elif action == "delete":
            node.deleted = True
            victims = [w for uid, w in self.workers.items() if self._node_of.get(uid) == name]
            for w in victims:
                w.stop(0.0, delete=False)
            await asyncio.gather(*(w.task for w in victims), return_exceptions=True)
            await asyncio.gather(*(self._delete_now(w.pod) for w in victims))
            with contextlib.suppress(ApiError):
                await self.api.delete(f"/api/v1/nodes/{name}")
        elif action == "add":
            await self.nodes.register(node)
        else:
            raise ValueError(f"unknown node action {action!r}")

    async def fault_evict(self, namespace: str, pod: str, reason: str) -> None:
        """Preemption notice: DisruptionTarget condition, then graceful deletion."""
        worker = self.find_pod(namespace, pod)
        if worker is None:
            raise LookupError(f"pod {namespace}/{pod} does not run here")
        worker.extra_conditions.append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": reason,
                "message": "devcluster: the pod is being preempted",
                "lastProbeTime": None,
                "lastTransitionTime": now(),
            }
        )
        await worker.patch_status_now()
        await self.api.delete(f"/api/v1/namespaces/{namespace}/pods/{pod}")

    def status(self) -> dict[str, Any]:
        """Nodes and pods as seen by the agent."""
        return {
            "nodes": {
                n.name: {"ip": n.ip, "heartbeating": n.heartbeating, "deleted": n.deleted}
                for n in self.nodes.by_name.values()
            },
            "pods": [
                {
                    "namespace": w.namespace,
                    "name": w.name,
                    "node": self._node_of.get(uid),
                    "ip": w.pod_ip,
                    "phase": w.phase,
                    "pids": [c.proc.pid for c in w.containers() if c.proc and "running" in c.state],
                }
                for uid, w in self.workers.items()
            ],
        }

    # ----- main ----------------------------------------------------------
    async def run(self) -> None:
        """Run until SIGTERM/SIGINT, then stop every pod process."""
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        runners: list[web.AppRunner] = []
        kubelet = web.AppRunner(kubelet_app(self), access_log=None)
        await kubelet.setup()
        runners.append(kubelet)
        tls = kubelet_ssl(self.cfg)
        for node in self.nodes.by_name.values():
            await web.TCPSite(kubelet, node.ip, self.cfg.kubelet_port, ssl_context=tls).start()
        control = web.AppRunner(control_app(self), access_log=None)
        await control.setup()
        runners.append(control)
        self.cfg.agent_socket.unlink(missing_ok=True)
        await web.UnixSite(control, str(self.cfg.agent_socket)).start()
        tasks = [
            asyncio.create_task(self.nodes.run(), name="nodes"),
            asyncio.create_task(
                Informer(self.api, "/api/v1/endpoints", self.hosts.on_endpoints).run(),
                name="endpoints",
            ),
            asyncio.create_task(Informer(self.api, "/api/v1/pods", self.on_pod).run(), name="pods"),
        ]
        if self.cfg.owner_pid is not None:
            tasks.append(asyncio.create_task(self._watch_owner(self.cfg.owner_pid), name="owner"))
        logger.info("agent running %d nodes", len(self.nodes.by_name))
        stopper = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stopper and task.exception():
                logger.error("agent task %s failed", task.get_name(), exc_info=task.exception())
        for task in tasks:
            task.cancel()
        await self.shutdown()
        for r in runners:
            await r.cleanup()
        await self.api.close()
        if self._orphaned:
            logger.warning("owner process is gone: stopping the whole cluster")
            await asyncio.to_thread(procs.stop_all, self.cfg.run_dir, [], 5.0)

    async def _watch_owner(self, pid: int) -> None:
        while procs.alive(pid):
            await asyncio.sleep(2.0)
        self._orphaned = True

    async def shutdown(self) -> None:
        """SIGTERM every pod, SIGKILL after a short grace; no API calls."""
        workers = list(self.workers.values())
        for w in workers:
            w.stop(SHUTDOWN_GRACE, delete=False)
        if workers:
            await asyncio.wait([w.task for w in workers], timeout=SHUTDOWN_GRACE + 5)
        for w in workers:
            w.task.cancel()
