"""The operator on a private real-node devcluster, for the benchmarks that run jobs on real
nodes (``restart_pods.py``, ``sharded_pods.py``, ``operator_handover.py``), and how they
report their runs: each run's figure, then each way's median."""

from __future__ import annotations

import contextlib
import shutil
import statistics
import tempfile
from collections.abc import Callable, Iterator
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


def in_place_and_new_pods(
    repeat: int, run: Callable[[str, bool], float], figure: str
) -> dict[str, float]:
    """Run ``repeat`` pairs of jobs, each pair in place (the operator's way) then with new
    pods (every pod replaced): ``run(name, replace_pods)`` returns a run's seconds, ``figure``
    says what they measure. Prints each run, then returns the medians (printed too)."""
    results: dict[str, list[float]] = {"in place": [], "new pods": []}
    for k in range(repeat):
        for what, replace in (("in place", False), ("new pods", True)):
            seconds = run(f"{'newpods' if replace else 'inplace'}-{k}", replace)
            results[what].append(seconds)
            print(f"{what} run {k}: {figure} {seconds:.2f} s", flush=True)
    return medians(results)


def medians(results: dict[str, list[float]]) -> dict[str, float]:
    """Each way's median of ``results`` (seconds by way), printed."""
    found = {what: statistics.median(figures) for what, figures in results.items()}
    for what, median in found.items():
        print(f"{what}: median {median:.2f} s")
    return found
