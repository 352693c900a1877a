"""The operator on a private real-node devcluster, for the benchmarks that run jobs on real
nodes (``restart_pods.py``, ``sharded_pods.py``, ``operator_handover.py``)."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from devcluster.cluster import Cluster
from devcluster.config import ClusterConfig
from tests.support.kube import Kube
from tests.support.operator_release import CHART, RELEASE, SYSTEM_NS

NAMESPACE = "bench"
"""The namespace of the benchmark's jobs."""


@contextlib.contextmanager
def operator_on_real_nodes(prefix: str, net: int) -> Iterator[tuple[Cluster, Kube, Path]]:
    """A real-node devcluster on network ``net`` (apart from the tests'), the operator
    installed with helm and serving, and the namespace of the jobs; the cluster, that
    namespace and a scratch folder (``prefix``: its name's start). All is gone after."""
    run_dir = Path(tempfile.mkdtemp(prefix=prefix))
    cluster = Cluster(ClusterConfig.private(run_dir, net, runtime="containerd"))
    cluster.up(timeout=900)
    try:
        cluster.helm(
            "install", RELEASE, str(CHART), "-n", SYSTEM_NS, "--create-namespace",
            "--set", "logLevel=warning", "--wait", "--timeout", "300s", timeout=360,
        )  # fmt: skip
        cluster.kubectl("create", "namespace", NAMESPACE)
        yield cluster, Kube(cluster, NAMESPACE), run_dir
    finally:
        cluster.down()
        shutil.rmtree(run_dir, ignore_errors=True)
