"""End-to-end tests of the operator on devcluster (marked ``devcluster``; the cluster
fixtures are in tests/support/cluster_fixtures.py).

The suite runs on real nodes (kubelets on containerd, the project's images, pod networks in
their own namespaces, kube-proxy, cluster DNS). ``ELASTICJOB_E2E_RUNTIME=process`` runs it on
process nodes instead: quicker to start, but no container, image or network of its own."""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from devcluster.cluster import Cluster
from tests.support.kube import Kube
from tests.support.operator_release import CHART, OPERATOR_PODS, RELEASE, SYSTEM_NS, operator_logs

CLUSTER_FIXTURES = "tests.support.cluster_fixtures"
E2E_RUNTIME_ENV = "ELASTICJOB_E2E_RUNTIME"
CLUSTER_OF_RUNTIME = {"containerd": "real_cluster", "process": "process_cluster"}
OPERATOR_LINES_ON_FAILURE = 80
"""How many of the operator's last log lines about a failed test's namespace its report shows."""


def pytest_configure(config: pytest.Config) -> None:
    """Load the cluster fixtures as a plugin (once, also when both cluster suites run):
    ``pytest_plugins`` works only in the top-level conftest, and there it would make unit and
    integration runs import devcluster."""
    config.pluginmanager.import_plugin(CLUSTER_FIXTURES)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.devcluster)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test that ran jobs under the operator reports what the operator logged about
    its namespace (the drivers' decisions), after the namespace's own dump."""
    report = yield
    funcargs = getattr(item, "funcargs", {})
    kube, cluster = funcargs.get("kube"), funcargs.get("operator")
    if report.when != "call" or not report.failed or not isinstance(kube, Kube) or cluster is None:
        return report
    lines = [line for line in operator_logs(cluster, timeout=10).splitlines() if kube.ns in line]
    report.sections.append(
        (f"operator log about {kube.ns}", "\n".join(lines[-OPERATOR_LINES_ON_FAILURE:]))
    )
    return report


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Cluster:
    """The suite's cluster: real nodes unless ``ELASTICJOB_E2E_RUNTIME`` says ``process``."""
    runtime = os.environ.get(E2E_RUNTIME_ENV, "containerd")
    if runtime not in CLUSTER_OF_RUNTIME:
        raise pytest.UsageError(f"{E2E_RUNTIME_ENV} must be one of {sorted(CLUSTER_OF_RUNTIME)}")
    found: Cluster = request.getfixturevalue(CLUSTER_OF_RUNTIME[runtime])
    return found


@pytest.fixture(scope="module")
def operator(cluster: Cluster) -> Iterator[Cluster]:
    """The operator, installed with helm into its own namespace (once for each test module
    that uses it, uninstalled after the module). ``helm install --wait`` returns once the
    operator is ready, which includes its admission webhook being registered."""
    result = cluster.helm(
        "install",
        RELEASE,
        str(CHART),
        "-n",
        SYSTEM_NS,
        "--create-namespace",
        "--set",
        "logLevel=debug",
        "--wait",
        "--timeout",
        "240s",
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, f"helm install failed:\n{result.stdout}\n{result.stderr}"
    try:
        yield cluster
    finally:
        cluster.helm("uninstall", RELEASE, "-n", SYSTEM_NS, check=False, timeout=60)
        # The next module's operator must be the only one: a terminating pod would still
        # answer the webhook and the workers.
        cluster.kubectl(
            "-n", SYSTEM_NS, "wait", "--for=delete", "pod", "-l", OPERATOR_PODS, "--timeout=120s",
            check=False, timeout=150,
        )  # fmt: skip
