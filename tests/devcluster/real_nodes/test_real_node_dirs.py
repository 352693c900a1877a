"""Real nodes do not share the kubelet's fixed host paths: kubelets started at the same instant
all run, and each serves device plugins from its own node's directory."""

from __future__ import annotations

import os
import socket
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

import pytest

from devcluster.build import find_node_binaries
from devcluster.cluster import Cluster
from devcluster.nodes import RealNode, real_nodes
from tests.support.kube import Kube
from tests.support.real_pods import node_objects

pytestmark = pytest.mark.devcluster

#: Where a 1.20 kubelet listens for device plugins, whatever its flags.
KUBELET_SOCKET = Path("var/lib/kubelet/device-plugins/kubelet.sock")


def _restart_kubelets_at_one_instant(cluster: Cluster, nodes: list[RealNode]) -> datetime:
    """Stop every node's kubelet, then start them all from threads released by one barrier;
    returns the first whole second after the old kubelets stopped."""
    bins = find_node_binaries(cluster.config.cache_dir, build=False)
    argvs = {}
    for node in nodes:
        cluster.stop_component(node.component("kubelet"))
        containerd = cluster.pid(node.component("containerd"))
        assert containerd is not None, f"containerd of {node.name} is not running"
        argvs[node.name] = node.kubelet_argv(bins, containerd)
    barrier = threading.Barrier(len(nodes), timeout=30)

    def start(node: RealNode) -> None:
        barrier.wait()
        cluster.spawn(node.component("kubelet"), argvs[node.name])

    # Node conditions carry whole seconds: the next one after every old kubelet stopped.
    started = (datetime.now(UTC) + timedelta(seconds=1)).replace(microsecond=0)
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        for future in [pool.submit(start, node) for node in nodes]:
            future.result()
    return started


def _heard_since(kube: Kube, since: datetime) -> bool:
    """Every node is Ready, as its kubelet reported after ``since``."""
    for node in node_objects(kube):
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        if not ready or ready[0]["status"] != "True":
            return False
        heartbeat = datetime.fromisoformat(ready[0]["lastHeartbeatTime"].replace("Z", "+00:00"))
        if heartbeat < since:
            return False
    return True


def _socket_of(cluster: Cluster, node: RealNode) -> os.stat_result | None:
    """The device-plugin socket as the node's kubelet sees it (in its mount namespace)."""
    pid = cluster.pid(node.component("kubelet"))
    try:
        return os.stat(Path(f"/proc/{pid}/root") / KUBELET_SOCKET)
    except OSError:
        return None


def test_kubelets_started_together_run_and_each_serves_device_plugins_from_its_node(
    real_cluster: Cluster, real_kube: Kube
) -> None:
    cfg = real_cluster.config
    nodes = real_nodes(cfg)
    started = _restart_kubelets_at_one_instant(real_cluster, nodes)
    real_kube.wait(
        "every node Ready, reported by its restarted kubelet",
        lambda: _heard_since(real_kube, started),
        timeout=120,
    )
    running = real_cluster.running()
    dead = [node.name for node in nodes if not running.get(node.component("kubelet"))]
    assert not dead, "kubelets died: " + "; ".join(
        real_cluster.log_tail(f"{name}-kubelet", 5) for name in dead
    )
    seen = {
        node.name: real_kube.wait(
            f"{node.name}'s kubelet listening for device plugins",
            partial(_socket_of, real_cluster, node),
        )
        for node in nodes
    }
    for node in nodes:
        own = node.kubelet_dir / "device-plugins" / "kubelet.sock"
        assert own.exists(), f"{node.name}: no device-plugin socket in {own.parent}"
        assert stat.S_ISSOCK(own.stat().st_mode)
        assert (own.stat().st_dev, own.stat().st_ino) == (
            seen[node.name].st_dev,
            seen[node.name].st_ino,
        ), f"{node.name}'s kubelet listens on another directory's socket than {own}"
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(5)
            conn.connect(str(own))  # its kubelet accepts there
    assert len({(s.st_dev, s.st_ino) for s in seen.values()}) == len(nodes)
    # A 1.20 kubelet registering with an existing Node zeroes its extended resources when its
    # device-plugin directory is empty; each node's still holds what its kubelet wrote there.
    for obj in node_objects(real_kube):
        allocatable = obj["status"]["allocatable"]
        for resource, amount in cfg.extended_resources.items():
            assert allocatable.get(resource) == amount, (obj["metadata"]["name"], allocatable)
