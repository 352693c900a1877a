"""``up`` and ``down`` of a real-node cluster (``ClusterConfig(runtime="containerd")``).

``up``: images (built or found in the cache by :mod:`devcluster.imagebuild`), the node
network (:mod:`devcluster.realnet`), the control plane with the API server on the host bridge,
cluster DNS (:mod:`devcluster.clusterdns`), then per node containerd, the images imported into
it, kubelet and kube-proxy (:mod:`devcluster.nodes`); it returns when every node is Ready.
How long each step took is written to ``<run_dir>/timings.json``.

``down``: kubelets and kube-proxies first (so nothing restarts a container), every container
process, then the remaining processes (control plane, containerd, shims, dnsmasq), then what
processes leave behind (:mod:`devcluster.nodeclean`) and the network.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from devcluster import clusterdns, nodeclean, procs, provisioner, realnet
from devcluster import controlplane as cp
from devcluster.build import Binaries, NodeBinaries, find_node_binaries
from devcluster.config import ClusterConfig
from devcluster.imagebuild import PAUSE_IMAGE, BuiltImage, ensure_images
from devcluster.nodes import RealNode, import_images, real_nodes

if TYPE_CHECKING:
    from devcluster.cluster import Cluster

logger = logging.getLogger(__name__)

NODE_PROCESSES = ("containerd", "kubelet", "kube-proxy")
DNS_PROCESSES = ("cluster-dns", "cluster-dns-feeder")


def components(cfg: ClusterConfig) -> list[str]:
    """Process names of a real-node cluster besides the control plane, in start order."""
    return [
        *DNS_PROCESSES,
        provisioner.COMPONENT,
        *[f"{node}-{what}" for node in cfg.node_names() for what in NODE_PROCESSES],
    ]


def timings_path(cfg: ClusterConfig) -> Path:
    """Seconds each step of the last ``up`` took."""
    return cfg.run_dir / "timings.json"


class RealNodes:
    """Starts the real nodes of ``cluster`` (whose control plane it also starts)."""

    def __init__(self, cluster: Cluster, bins: Binaries) -> None:
        self.cluster = cluster
        self.cfg = cluster.config
        self.bins = bins
        self.node_bins = find_node_binaries(self.cfg.cache_dir)
        self.images: list[BuiltImage] = []
        self.timings: dict[str, float] = {}

    def prepare_images(self) -> None:
        """Build the images, or find them cached."""
        started = time.monotonic()
        self.images = ensure_images(self.cfg.cache_dir)
        self.timings["images_s"] = time.monotonic() - started

    def start(self, timeout: float) -> None:
        """Everything after :meth:`prepare_images`; returns when every node is Ready."""
        cfg = self.cfg
        cluster = self.cluster
        started = time.monotonic()
        deadline = started + timeout

        def left() -> float:
            return max(1.0, deadline - time.monotonic())

        def lap(name: str, since: float) -> float:
            now = time.monotonic()
            self.timings[name] = now - since
            return now

        t = time.monotonic()
        realnet.create(cfg)
        t = lap("network_s", t)
        probe = cluster.start_control_plane(self.bins, left, controller_manager=False)
        t = lap("control_plane_s", t)
        clusterdns.hosts_dir(cfg).mkdir(parents=True, exist_ok=True)
        cluster.spawn("cluster-dns", clusterdns.dnsmasq_argv(cfg))
        cluster.spawn("cluster-dns-feeder", clusterdns.feeder_argv(cfg, sys.executable))
        cluster.spawn(provisioner.COMPONENT, provisioner.argv(cfg, sys.executable))
        nodes = real_nodes(cfg)
        for node in nodes:
            self._reset_node_state(node)
            node.write_configs(PAUSE_IMAGE)
            cluster.spawn(node.component("containerd"), node.containerd_argv())
        for node in nodes:
            cp.wait_for(
                f"containerd of {node.name}", node.containerd_ready, left(), cluster.dead_component
            )
        t = lap("containerd_s", t)
        import_images(nodes, [image.archive for image in self.images])
        t = lap("image_import_s", t)
        nodeclean.save_kernel_tunables(cfg)
        for node in nodes:
            start_kubelet(cluster, node, self.node_bins)
        objects = {"apiVersion": "v1", "kind": "List", "items": clusterdns.dns_objects(cfg)}
        cluster.kubectl("apply", "-f", "-", input=json.dumps(objects))
        cluster.wait_nodes_ready(probe, left)
        cluster.start_controller_manager(self.bins)
        cluster.wait_service_account(probe, left)
        advertise_extended_resources(cluster)
        lap("nodes_ready_s", t)
        self.timings["up_s"] = time.monotonic() - started + self.timings.get("images_s", 0.0)
        timings_path(cfg).write_text(json.dumps(self.timings, indent=1))

    def _reset_node_state(self, node: RealNode) -> None:
        """Forget the previous run's pods (containerd's content and snapshots stay)."""
        for stale in ("kubelet", "containerd/state", "cni"):
            shutil.rmtree(node.dir / stale, ignore_errors=True)


def start_kubelet(cluster: Cluster, node: RealNode, bins: NodeBinaries) -> None:
    """Start a node's kubelet and kube-proxy (containerd must be running)."""
    containerd = cluster.pid(node.component("containerd"))
    if containerd is None:
        raise RuntimeError(f"containerd of {node.name} is not running")
    cluster.spawn(node.component("kubelet"), node.kubelet_argv(bins, containerd))
    cluster.spawn(node.component("kube-proxy"), node.kube_proxy_argv(bins))


def advertise_extended_resources(cluster: Cluster, nodes: list[str] | None = None) -> None:
    """Add ``extended_resources`` (e.g. nvidia.com/gpu) to the capacity of ``nodes`` (all by
    default), the way a cluster operator advertises them (a patch of the Node status; the
    kubelet then reports them as allocatable). A node that registers again has them no more
    until they are advertised again (``node_add`` does)."""
    for name in nodes if nodes is not None else cluster.config.node_names():
        patch = [
            {"op": "add", "path": f"/status/capacity/{key.replace('/', '~1')}", "value": value}
            for key, value in cluster.config.extended_resources.items()
        ]
        if patch:
            cluster.kubectl(
                "patch", "node", name, "--subresource=status", "--type=json",
                "-p", json.dumps(patch),
            )  # fmt: skip


def _node_agents(cfg: ClusterConfig, pids: dict[str, int]) -> list[int]:
    """Pids of the cluster's kubelets and kube-proxies (from the pid file and from /proc)."""
    found = {pid for name, pid in pids.items() if name.endswith(("-kubelet", "-kube-proxy"))}
    for pid in procs.marked_pids(cfg.run_dir):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) in (b"kubelet", b"kube-proxy"):
            found.add(pid)
    return [pid for pid in found if procs.is_marked(pid, cfg.run_dir)]


def stop_nodes(cfg: ClusterConfig, pids: dict[str, int]) -> None:
    """Stop the kubelets and kube-proxies, then kill every container process."""
    procs.terminate(_node_agents(cfg, pids), 10.0)
    nodeclean.kill_containers(cfg)


def remove_leftovers(cfg: ClusterConfig) -> None:
    """After every process of the cluster ended: containers, mounts, cgroups, files, network."""
    nodeclean.kill_containers(cfg)
    nodeclean.unmount_all(cfg.run_dir)
    nodeclean.remove_node_files(cfg)
    nodeclean.restore_kernel_tunables(cfg)
    realnet.destroy(cfg)


def clean_stale(cfg: ClusterConfig) -> None:
    """Before ``up`` (no process of the run directory alive): remove a crashed run's leftovers."""
    if realnet.record_path(cfg).exists() or nodeclean.mounts_under(cfg.run_dir):
        logger.info("removing what a previous run in %s left behind", cfg.run_dir)
        remove_leftovers(cfg)
