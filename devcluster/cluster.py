"""The Python API of devcluster: start, stop and inspect a cluster.

>>> cluster = Cluster(ClusterConfig(nodes=2))
>>> cluster.up()           # returns once /readyz is ok, nodes are Ready and
...                        # the default ServiceAccount exists
>>> cluster.kubectl("get", "nodes")
>>> cluster.down()         # stops everything, leaves no process behind

The cluster runs the control plane; its nodes come from the node runtime that
``ClusterConfig.runtime`` names (:mod:`devcluster.noderuntime`): the node agent
(:mod:`devcluster.processnodes`), or with ``runtime="containerd"`` real nodes (kubelet,
containerd, CNI, kube-proxy: :mod:`devcluster.realcluster`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devcluster import controlplane as cp
from devcluster import pki, procs
from devcluster.build import Binaries, find_binaries
from devcluster.config import ClusterConfig, read_token
from devcluster.faults import Faults
from devcluster.noderuntime import NodeRuntime
from devcluster.processnodes import ProcessNodes
from devcluster.realcluster import RealNodes

logger = logging.getLogger(__name__)

CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
#: The node runtime of each ``ClusterConfig.runtime``.
NODE_RUNTIMES: dict[str, Callable[[ClusterConfig], NodeRuntime]] = {
    "process": ProcessNodes,
    "containerd": RealNodes,
}


class ToolFailed(subprocess.CalledProcessError):
    """A cluster tool exited non-zero; unlike its base class, it says what the tool wrote
    on stderr."""

    def __str__(self) -> str:
        said = (self.stderr or "").strip()
        return f"{super().__str__()}: {said}" if said else super().__str__()


class Cluster:
    """One devcluster, identified by its run directory."""

    def __init__(self, config: ClusterConfig | None = None) -> None:
        self.config = config or ClusterConfig()
        self.node_runtime = NODE_RUNTIMES[self.config.runtime](self.config)
        self.faults: Faults = self.node_runtime.faults(self)
        self._pids: dict[str, int] = {}
        #: Components stopped on purpose (faults): not reported as dead while waiting.
        self._stopped: set[str] = set()
        #: Guards the two above and the pid file: components start and stop from several
        #: threads (a timed ``node_notready`` restarts its kubelet from a timer thread).
        self._lock = threading.Lock()

    @classmethod
    def from_run_dir(cls, run_dir: Path) -> Cluster:
        """Attach to a cluster started earlier (reads its config and pids)."""
        cluster = cls(ClusterConfig.load(run_dir))
        cluster._pids = cluster._read_pids()
        return cluster

    # ----- state ---------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        """Path of the admin kubeconfig."""
        return self.config.kubeconfig

    def env(self) -> dict[str, str]:
        """os.environ plus KUBECONFIG and PATH with helm/kubectl of this cluster."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["PATH"] = f"{self.config.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        return env

    def _pid_file(self) -> Path:
        return self.config.run_dir / "pids.json"

    def _read_pids(self) -> dict[str, int]:
        try:
            data: dict[str, int] = json.loads(self._pid_file().read_text())
        except (OSError, ValueError):
            return {}
        return data

    def _write_pids(self) -> None:
        self._pid_file().write_text(json.dumps(self._pids))

    def pid(self, component: str) -> int | None:
        """Process id of a component (etcd, kube-apiserver, ..., agent)."""
        return (self._pids or self._read_pids()).get(component)

    def components(self) -> list[str]:
        """Names of the processes this cluster runs, in start order."""
        return [*CONTROL_PLANE, *self.node_runtime.components()]

    def running(self) -> dict[str, bool]:
        """Which components are alive."""
        run_dir = self.config.run_dir
        pids = self._pids or self._read_pids()
        return {
            name: procs.is_marked(pids[name], run_dir) for name in self.components() if name in pids
        }

    def dead_component(self) -> str | None:
        """The first started component that exited (with its log tail), if any."""
        with self._lock:
            pids = dict(self._pids)
        for name, pid in pids.items():
            if name in self._stopped:
                continue
            if not procs.alive(pid):
                tail = self.log_tail(name)
                return f"{name} (log {self.config.logs_dir / (name + '.log')}):\n{tail}"
        return None

    def log_tail(self, component: str, lines: int = 30) -> str:
        """The last lines of a component's log."""
        try:
            text = (self.config.logs_dir / f"{component}.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    # ----- lifecycle -----------------------------------------------------
    def _prepare(self, bins: Binaries) -> None:
        cfg = self.config
        if procs.marked_pids(cfg.run_dir):
            raise RuntimeError(
                f"a cluster is already running in {cfg.run_dir}; run `python -m devcluster down`"
            )
        cfg.run_dir.mkdir(parents=True, exist_ok=True)
        self.node_runtime.clean_stale()
        for stale in ("etcd", "pods", "logs", "volumes", "dns"):
            shutil.rmtree(cfg.run_dir / stale, ignore_errors=True)
        cfg.logs_dir.mkdir()
        cfg.pods_dir.mkdir()
        cfg.save()
        pki.ensure_pki(cfg)
        pki.write_kubeconfig(cfg, cfg.kubeconfig, "admin", read_token(cfg, "admin"))
        for user, name in (
            ("kube-controller-manager", "controller-manager"),
            ("kube-scheduler", "scheduler"),
            ("devcluster-agent", "agent"),
        ):
            path = cfg.run_dir / f"{name}.kubeconfig"
            pki.write_kubeconfig(cfg, path, user, read_token(cfg, user))
        cfg.bin_dir.mkdir(exist_ok=True)
        for tool in (bins.helm, bins.kubectl):
            if tool is not None:
                link = cfg.bin_dir / tool.name
                link.unlink(missing_ok=True)
                link.symlink_to(tool)

    def spawn(self, name: str, argv: list[str]) -> None:
        """Start a component of this cluster (detached, marked, pid recorded); threads may
        start components at the same time."""
        pid = procs.spawn(name, argv, self.config.run_dir, self.config.logs_dir)
        with self._lock:
            self._pids[name] = pid
            self._stopped.discard(name)
            self._write_pids()

    def stop_component(self, name: str, grace: float = 10.0) -> None:
        """Stop one component (SIGTERM, then SIGKILL) and forget its pid."""
        pid = (self._pids or self._read_pids()).get(name)
        if pid is not None and procs.is_marked(pid, self.config.run_dir):
            procs.terminate([pid], grace)
        with self._lock:
            self._pids.pop(name, None)
            self._stopped.add(name)
            self._write_pids()

    def up(self, timeout: float = 120.0) -> None:
        """Start every component and wait until the cluster is usable.

        On failure (or Ctrl-C) everything started so far is stopped again.
        """
        cfg = self.config
        bins = find_binaries(cfg.cache_dir)
        started = time.monotonic()
        start_nodes = self.node_runtime.prepare(self, bins)
        self._prepare(bins)
        try:
            start_nodes(timeout)
        except BaseException:
            logger.error("devcluster up failed; stopping what was started")
            self.down()
            raise
        logger.info(
            "devcluster is up in %.1f s (%d %s nodes); KUBECONFIG=%s",
            time.monotonic() - started,
            cfg.nodes,
            cfg.runtime,
            cfg.kubeconfig,
        )

    def start_control_plane(
        self, bins: Binaries, left: Callable[[], float], *, controller_manager: bool = True
    ) -> cp.ApiProbe:
        """etcd and the API server (ready), controller-manager (unless told not to: see
        :meth:`start_controller_manager`) and scheduler (started)."""
        cfg = self.config
        t0 = time.monotonic()
        self.spawn("etcd", cp.etcd_argv(cfg, bins))
        cp.wait_for("etcd", lambda: cp.etcd_healthy(cfg), left(), self.dead_component)
        logger.debug("etcd healthy after %.1f s", time.monotonic() - t0)
        self.spawn("kube-apiserver", cp.apiserver_argv(cfg, bins))
        probe = cp.ApiProbe(cfg, read_token(cfg, "admin"))
        cp.wait_for(
            "kube-apiserver /readyz",
            lambda: probe.get("/readyz")[0] == 200,
            left(),
            self.dead_component,
        )
        logger.debug("kube-apiserver ready after %.1f s", time.monotonic() - t0)
        if controller_manager:
            self.start_controller_manager(bins)
        self.spawn("kube-scheduler", cp.scheduler_argv(cfg, bins))
        return probe

    def start_controller_manager(self, bins: Binaries) -> None:
        """Start kube-controller-manager. Real kubelets register their nodes NotReady: a node
        lifecycle controller that sees every node NotReady enters its "master disruption
        mode", and once out of it (Kubernetes 1.20) never taints a node that stops answering
        with ``NoExecute``, so its pods are never evicted. Real nodes start it once they are
        Ready."""
        self.spawn("kube-controller-manager", cp.controller_manager_argv(self.config, bins))

    def wait_usable(self, probe: cp.ApiProbe, left: Callable[[], float]) -> None:
        """Wait for the default ServiceAccount and every node Ready."""
        self.wait_service_account(probe, left)
        self.wait_nodes_ready(probe, left)

    def wait_service_account(self, probe: cp.ApiProbe, left: Callable[[], float]) -> None:
        """Wait for the default ServiceAccount's token (the controller-manager makes it)."""
        t0 = time.monotonic()
        cp.wait_for(
            "the default ServiceAccount",
            lambda: bool(
                (probe.get_json("/api/v1/namespaces/default/serviceaccounts/default") or {}).get(
                    "secrets"
                )
            ),
            left(),
            self.dead_component,
        )
        logger.debug("default ServiceAccount after %.1f s", time.monotonic() - t0)

    def wait_nodes_ready(self, probe: cp.ApiProbe, left: Callable[[], float]) -> None:
        """Wait for every node Ready."""
        cfg = self.config
        cp.wait_for(
            f"{cfg.nodes} Ready nodes",
            lambda: cp.nodes_ready(probe, cfg.node_names()),
            left(),
            self.dead_component,
        )

    def down(self) -> None:
        """Stop every process of this cluster (pods first, etcd last); for real nodes also
        remove their containers, mounts, cgroups and network."""
        pids = self._pids or self._read_pids()
        self.node_runtime.stop_nodes(pids)
        order = [pids[name] for name in reversed(self.components()) if name in pids]
        procs.stop_all(self.config.run_dir, order)
        self._pids = {}
        self._pid_file().unlink(missing_ok=True)
        self.config.agent_socket.unlink(missing_ok=True)
        self.node_runtime.remove_leftovers()

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait for /readyz and Ready nodes of an already running cluster."""
        probe = cp.ApiProbe(self.config, read_token(self.config, "admin"))
        cp.wait_for("/readyz", lambda: probe.get("/readyz")[0] == 200, timeout, lambda: None)
        cp.wait_for(
            "Ready nodes",
            lambda: cp.nodes_ready(probe, self.config.node_names()),
            timeout,
            lambda: None,
        )

    # ----- tools ---------------------------------------------------------
    def run_tool(
        self,
        tool: str,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``kubectl``/``helm``/... against this cluster, capturing output."""
        result = subprocess.run(
            [tool, *args],
            input=input,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and result.returncode != 0:
            raise ToolFailed(result.returncode, result.args, result.stdout, result.stderr)
        return result

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster."""
        return self.run_tool("kubectl", *args, **kwargs)

    def helm(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run helm against this cluster."""
        return self.run_tool("helm", *args, **kwargs)
