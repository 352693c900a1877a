"""Process nodes (``ClusterConfig(runtime="process")``): one node agent plays every node and
runs pods as host processes (:mod:`devcluster.agent`); faults are requests to the agent
(:class:`devcluster.faults.Faults`). Everything of it ends with its processes."""

from __future__ import annotations

import functools
import sys
import time

from devcluster import controlplane as cp
from devcluster import provisioner
from devcluster.build import Binaries
from devcluster.config import ClusterConfig
from devcluster.faults import Faults
from devcluster.noderuntime import NodeStart, ProcessHost

AGENT = "agent"


class ProcessNodes:
    """The node runtime of process nodes (a :class:`~devcluster.noderuntime.NodeRuntime`)."""

    def __init__(self, config: ClusterConfig) -> None:
        self._config = config

    def components(self) -> list[str]:
        """The volume provisioner and the node agent."""
        return [provisioner.COMPONENT, AGENT]

    def faults(self, host: ProcessHost) -> Faults:
        """A client of the agent's control endpoint."""
        return Faults(self._config)

    def prepare(self, host: ProcessHost, bins: Binaries) -> NodeStart:
        """Nothing to prepare; returns :meth:`_start` for ``host``."""
        return functools.partial(self._start, host, bins)

    def clean_stale(self) -> None:
        """Nothing outlives the processes of process nodes."""

    def stop_nodes(self, pids: dict[str, int]) -> None:
        """The agent stops with the cluster's other processes."""

    def remove_leftovers(self) -> None:
        """Nothing outlives the processes of process nodes."""

    def _start(self, host: ProcessHost, bins: Binaries, timeout: float) -> None:
        """The control plane, the provisioner and the agent; returns once the cluster is
        usable."""
        deadline = time.monotonic() + timeout

        def left() -> float:
            return max(1.0, deadline - time.monotonic())

        probe = host.start_control_plane(bins, left)
        host.spawn(provisioner.COMPONENT, provisioner.argv(self._config, sys.executable))
        host.spawn(AGENT, cp.agent_argv(self._config))
        host.wait_usable(probe, left)
