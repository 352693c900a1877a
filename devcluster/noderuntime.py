"""The node runtime of a cluster as a strategy, and what a runtime needs of its cluster.

A cluster (:class:`devcluster.cluster.Cluster`) runs the control plane; its nodes come from a
:class:`NodeRuntime`, picked by ``ClusterConfig.runtime``:

- ``process``: the node agent runs pods as host processes (:mod:`devcluster.processnodes`);
- ``containerd``: real nodes, kubelet and containerd (:mod:`devcluster.realcluster`).

A runtime reaches its cluster through :class:`ProcessHost` only, so the cluster module imports
the runtimes and no runtime imports the cluster module.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any, Protocol

from devcluster.build import Binaries
from devcluster.config import ClusterConfig
from devcluster.controlplane import ApiProbe
from devcluster.faults import Faults

#: Starts the nodes in a prepared run directory, within ``timeout`` seconds (its argument);
#: returns once the cluster is usable.
NodeStart = Callable[[float], None]


class ProcessHost(Protocol):
    """What a node runtime needs of its cluster: the settings, the processes (started
    detached, marked and recorded by component name), ``kubectl``, and the control plane."""

    config: ClusterConfig

    def spawn(self, name: str, argv: list[str]) -> None:
        """Start a component (detached, marked, pid recorded)."""

    def stop_component(self, name: str, grace: float = 10.0) -> None:
        """Stop one component and forget its pid."""

    def pid(self, component: str) -> int | None:
        """Process id of a component."""

    def running(self) -> dict[str, bool]:
        """Which components are alive."""

    def dead_component(self) -> str | None:
        """The first started component that exited (with its log tail), if any."""

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run kubectl against the cluster."""

    def start_control_plane(
        self, bins: Binaries, left: Callable[[], float], *, controller_manager: bool = True
    ) -> ApiProbe:
        """etcd and the API server (ready), the controller-manager (unless told not to) and
        the scheduler (started)."""

    def start_controller_manager(self, bins: Binaries) -> None:
        """Start kube-controller-manager."""

    def wait_usable(self, probe: ApiProbe, left: Callable[[], float]) -> None:
        """Wait for the default ServiceAccount and every node Ready."""

    def wait_service_account(self, probe: ApiProbe, left: Callable[[], float]) -> None:
        """Wait for the default ServiceAccount's token."""

    def wait_nodes_ready(self, probe: ApiProbe, left: Callable[[], float]) -> None:
        """Wait for every node Ready."""


class NodeRuntime(Protocol):
    """How a cluster's nodes run: their processes, how they start, their faults and what
    ``down`` removes after them."""

    def components(self) -> list[str]:
        """Names of the processes besides the control plane, in start order."""

    def faults(self, host: ProcessHost) -> Faults:
        """The fault injector of ``host``'s nodes."""

    def prepare(self, host: ProcessHost, bins: Binaries) -> NodeStart:
        """What ``up`` does before it prepares the run directory (real nodes: node binaries
        and images); returns the step that starts the nodes."""

    def clean_stale(self) -> None:
        """Before the run directory is prepared (no process of it alive): remove what a
        crashed run left behind besides its files."""

    def stop_nodes(self, pids: dict[str, int]) -> None:
        """The first step of ``down``, before the cluster's processes are stopped."""

    def remove_leftovers(self) -> None:
        """The last step of ``down``, after every process of the cluster ended."""
