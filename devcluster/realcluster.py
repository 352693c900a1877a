"""Real nodes (``ClusterConfig(runtime="containerd")``): their node runtime, ``up`` and ``down``.

``up``: images (built or found in the cache by :mod:`devcluster.imagebuild`), the node
network (:mod:`devcluster.realnet`), the control plane with the API server on the host bridge,
cluster DNS (:mod:`devcluster.clusterdns`), then per node its containerd root planted from the
image seed (:mod:`devcluster.nodeseed`, made first if the images changed), containerd, kubelet
and kube-proxy (:mod:`devcluster.nodes`); it returns when every node is Ready.
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from devcluster import clusterdns, nodeclean, procs, provisioner, realnet
from devcluster import controlplane as cp
from devcluster.build import Binaries, NodeBinaries, find_node_binaries
from devcluster.config import ClusterConfig
from devcluster.faults import Faults
from devcluster.imagebuild import PAUSE_IMAGE, BuiltImage, ensure_images
from devcluster.imageload import thin_docker_archive
from devcluster.noderuntime import NodeStart, ProcessHost
from devcluster.nodes import RealNode, advertise_extended_resources, real_nodes
from devcluster.nodeseed import NodeSeed
from devcluster.realfaults import RealFaults

logger = logging.getLogger(__name__)

NODE_PROCESSES = ("containerd", "kubelet", "kube-proxy")
DNS_PROCESSES = ("cluster-dns", "cluster-dns-feeder")


def timings_path(cfg: ClusterConfig) -> Path:
    """Seconds each step of the last ``up`` took."""
    return cfg.run_dir / "timings.json"


class RealNodes:
    """The node runtime of real nodes (a :class:`~devcluster.noderuntime.NodeRuntime`)."""

    def __init__(self, config: ClusterConfig) -> None:
        self._config = config

    def components(self) -> list[str]:
        """Cluster DNS, the volume provisioner, then per node containerd, kubelet and
        kube-proxy."""
        return [
            *DNS_PROCESSES,
            provisioner.COMPONENT,
            *[f"{node}-{what}" for node in self._config.node_names() for what in NODE_PROCESSES],
        ]

    def faults(self, host: ProcessHost) -> Faults:
        """Faults through the nodes' containerd, kubelets and network namespaces."""
        return RealFaults(host)

    def prepare(self, host: ProcessHost, bins: Binaries) -> NodeStart:
        """Find (or build) the node binaries, build the images or find them cached."""
        node_bins = find_node_binaries(self._config.cache_dir)
        started = time.monotonic()
        images = ensure_images(self._config.cache_dir)
        timings = {"images_s": time.monotonic() - started}
        return _NodesStart(host, bins, node_bins, images, timings).start

    def clean_stale(self) -> None:
        """Remove a crashed run's containers, mounts, cgroups, files and network."""
        cfg = self._config
        if realnet.record_path(cfg).exists() or nodeclean.mounts_under(cfg.run_dir):
            logger.info("removing what a previous run in %s left behind", cfg.run_dir)
            self.remove_leftovers()

    def stop_nodes(self, pids: dict[str, int]) -> None:
        """Stop the kubelets and kube-proxies, then kill every container process."""
        procs.terminate(_node_agents(self._config, pids), 10.0)
        nodeclean.kill_containers(self._config)

    def remove_leftovers(self) -> None:
        """Containers, mounts, cgroups, files, network."""
        cfg = self._config
        nodeclean.kill_containers(cfg)
        nodeclean.unmount_all(cfg.run_dir)
        nodeclean.remove_node_files(cfg)
        nodeclean.restore_kernel_tunables(cfg)
        realnet.destroy(cfg)


@dataclass
class _NodesStart:
    """Starts the real nodes of ``host`` (whose control plane it also starts), once their
    binaries and images are ready."""

    host: ProcessHost
    bins: Binaries
    node_bins: NodeBinaries
    images: list[BuiltImage]
    timings: dict[str, float]

    def start(self, timeout: float) -> None:
        """Everything after :meth:`RealNodes.prepare`; returns when every node is Ready."""
        host = self.host
        cfg = host.config
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
        probe = host.start_control_plane(self.bins, left, controller_manager=False)
        t = lap("control_plane_s", t)
        clusterdns.hosts_dir(cfg).mkdir(parents=True, exist_ok=True)
        host.spawn("cluster-dns", clusterdns.dnsmasq_argv(cfg))
        host.spawn("cluster-dns-feeder", clusterdns.feeder_argv(cfg, sys.executable))
        host.spawn(provisioner.COMPONENT, provisioner.argv(cfg, sys.executable))
        nodes = real_nodes(cfg)
        for node in nodes:
            self._reset_node_state(node)
            node.write_configs(PAUSE_IMAGE)
        seed = NodeSeed(cfg.cache_dir, [image.archive for image in self.images])
        with seed.locked():
            if not seed.exists():
                self._make_seed(seed, nodes[0], left)
                t = lap("image_seed_s", t)
            for node in nodes:
                seed.plant(node.containerd_root)
        t = lap("image_plant_s", t)
        for node in nodes:
            host.spawn(node.component("containerd"), node.containerd_argv())
        for node in nodes:
            self._wait_containerd(node, left)
        t = lap("containerd_s", t)
        nodeclean.save_kernel_tunables(cfg)
        for node in nodes:
            start_kubelet(host, node, self.node_bins)
        objects = {"apiVersion": "v1", "kind": "List", "items": clusterdns.dns_objects(cfg)}
        host.kubectl("apply", "-f", "-", input=json.dumps(objects))
        host.wait_nodes_ready(probe, left)
        host.start_controller_manager(self.bins)
        host.wait_service_account(probe, left)
        advertise_extended_resources(host)
        lap("nodes_ready_s", t)
        self.timings["up_s"] = time.monotonic() - started + self.timings.get("images_s", 0.0)
        timings_path(cfg).write_text(json.dumps(self.timings, indent=1))

    def _make_seed(self, seed: NodeSeed, node: RealNode, left: Callable[[], float]) -> None:
        """Import and unpack every image with ``node``'s containerd, then keep its root as
        the seed."""
        logger.info("importing and unpacking the images once, for every node (%s)", seed.key)
        from_earlier = seed.begin(node.containerd_root)
        component = node.component("containerd")
        self.host.spawn(component, node.containerd_argv())
        try:
            self._wait_containerd(node, left)
            if from_earlier:
                node.hold_images()
            for archive in seed.archives:
                began = time.monotonic()
                held = node.unpacked_layers()  # with the layers of the images just imported
                thin = node.dir / f"thin-{archive.name}"
                try:
                    node.import_image(thin if thin_docker_archive(archive, held, thin) else archive)
                finally:
                    thin.unlink(missing_ok=True)
                logger.debug("imported %s in %.1f s", archive.name, time.monotonic() - began)
            if from_earlier:
                began = time.monotonic()
                node.release_images()
                logger.debug("released the earlier images in %.1f s", time.monotonic() - began)
        finally:
            self.host.stop_component(component)
        seed.keep(node.containerd_root)

    def _wait_containerd(self, node: RealNode, left: Callable[[], float]) -> None:
        cp.wait_for(
            f"containerd of {node.name}", node.containerd_ready, left(), self.host.dead_component
        )

    def _reset_node_state(self, node: RealNode) -> None:
        """Forget the previous run's pods (containerd's content and snapshots stay)."""
        for stale in ("kubelet", "containerd/state", "cni"):
            shutil.rmtree(node.dir / stale, ignore_errors=True)


def start_kubelet(host: ProcessHost, node: RealNode, bins: NodeBinaries) -> None:
    """Start a node's kubelet and kube-proxy (containerd must be running)."""
    containerd = host.pid(node.component("containerd"))
    if containerd is None:
        raise RuntimeError(f"containerd of {node.name} is not running")
    host.spawn(node.component("kubelet"), node.kubelet_argv(bins, containerd))
    host.spawn(node.component("kube-proxy"), node.kube_proxy_argv(bins))


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
