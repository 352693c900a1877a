"""devcluster: a real Kubernetes control plane on one machine, with a node agent
that runs pods as local processes. See docs/devcluster.md.
"""

from devcluster.cluster import Cluster
from devcluster.config import ClusterConfig
from devcluster.faults import Faults

__all__ = ["Cluster", "ClusterConfig", "Faults"]
