"""devcluster: a real Kubernetes control plane on one machine, with a node agent
that runs pods as local processes. See docs/devcluster.md.

Importing the package imports none of its modules: the API is
:class:`devcluster.cluster.Cluster`, :class:`devcluster.config.ClusterConfig` and
:class:`devcluster.faults.Faults`.
"""
