"""End-to-end tests of the operator on devcluster (marked ``devcluster``; the cluster
fixtures are in tests/support/cluster_fixtures.py).

The suite runs on real nodes (kubelets on containerd, the project's images, pod networks in
their own namespaces, kube-proxy, cluster DNS). ``ELASTICJOB_E2E_RUNTIME=process`` runs it on
process nodes instead: quicker to start, but no container, image or network of its own."""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Final

import pytest

from devcluster.cluster import Cluster
from tests.support.elastic_jobs import worker_logs
from tests.support.kube import Kube
from tests.support.operator_release import SYSTEM_NS, OperatorRelease, operator_logs
from tests.support.quiet_gate import QUIET_MARK

CLUSTER_FIXTURES = "tests.support.cluster_fixtures"
E2E_RUNTIME_ENV = "ELASTICJOB_E2E_RUNTIME"
CLUSTER_OF_RUNTIME = {"containerd": "real_cluster", "process": "process_cluster"}
OPERATOR_LINES_ON_FAILURE = 150
"""How many of the operator's last log lines about a failed test's namespace its report shows
(its API client's requests left out)."""
OPERATOR_WIDE_LOGGERS = ("elasticjob.operator.leader_lease", "elasticjob.driver.loop_lag")
"""Loggers of facts about the operator, not a job, that a failed test's report shows too: a
change of leader or a late event loop explains a slow recovery."""
API_CLIENT_LOGGER = "urllib3.connectionpool"
WORKER_LOG_ON_FAILURE = 20_000
"""How much of the end of its worker pods' logs a failed test's report shows (characters)."""
NODE_COLUMNS = (
    "NAME:.metadata.name,"
    'READY:.status.conditions[?(@.type=="Ready")].status,'
    "TAINTS:.spec.taints[*].key"
)
"""What a failed test's report shows of each node (a node not ready, or tainted, explains
pods that were not placed or evicted)."""


def pytest_configure(config: pytest.Config) -> None:
    """Load the cluster fixtures as a plugin (once, also when both cluster suites run):
    ``pytest_plugins`` works only in the top-level conftest, and there it would make unit and
    integration runs import devcluster."""
    config.pluginmanager.import_plugin(CLUSTER_FIXTURES)


LAST: Final = ("uninstalls_operator", "no_operator")
"""What some tests do to the session's operator, in the order they run after all others."""


def _runs_after(item: pytest.Item) -> int:
    """0 for a test that leaves the session's operator as it found it; else the place of what
    it does to it in :data:`LAST`, plus one."""
    uses = getattr(item, "fixturenames", ())
    done = [i for i, what in enumerate(LAST) if what in uses or item.get_closest_marker(what)]
    return max(done, default=-1) + 1


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the suite's tests; run the one that uninstalls the operator, then those that
    want no operator, after every other (a stable sort). Among the tests that leave the
    operator as they found it, the quiet ones (``tests/support/quiet_gate.py``) come last:
    the other sessions' tests wait while one runs, and by then those sessions have usually
    ended."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.devcluster)
    items.sort(
        key=lambda item: (_runs_after(item), item.get_closest_marker(QUIET_MARK) is not None)
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test that ran jobs under the operator reports its pods, the nodes, what it
    logged about the test's namespace (the drivers' decisions) and the worker pods' logs
    (read before ``stop_workers`` deleted them), after the namespace's own dump."""
    report = yield
    funcargs = getattr(item, "funcargs", {})
    kube, cluster = funcargs.get("kube"), funcargs.get("operator")
    if report.when != "call" or not report.failed or not isinstance(kube, Kube) or cluster is None:
        return report

    def pods() -> str:
        found = cluster.kubectl("-n", SYSTEM_NS, "get", "pods", "-o", "wide", check=False)
        return found.stdout + found.stderr

    def nodes() -> str:
        columns = f"custom-columns={NODE_COLUMNS}"
        found = cluster.kubectl("get", "nodes", "-o", columns, check=False)
        return found.stdout + found.stderr

    def operator_log() -> str:
        lines = [
            line
            for line in operator_logs(cluster, timeout=10).splitlines()
            if (kube.ns in line and API_CLIENT_LOGGER not in line)
            or any(logger in line for logger in OPERATOR_WIDE_LOGGERS)
        ]
        return "\n".join(lines[-OPERATOR_LINES_ON_FAILURE:])

    for title, read in [
        ("operator pods", pods),
        ("nodes", nodes),
        (f"operator log about {kube.ns}", operator_log),
        ("worker pods' logs", lambda: worker_logs(kube)[-WORKER_LOG_ON_FAILURE:]),
    ]:
        try:
            text = read()
        except Exception as exc:  # a report that cannot be read must not end the session
            text = f"(could not be read: {type(exc).__name__}: {exc})"
        report.sections.append((title, text))
    return report


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Cluster:
    """The suite's cluster: real nodes unless ``ELASTICJOB_E2E_RUNTIME`` says ``process``."""
    runtime = os.environ.get(E2E_RUNTIME_ENV, "containerd")
    if runtime not in CLUSTER_OF_RUNTIME:
        raise pytest.UsageError(f"{E2E_RUNTIME_ENV} must be one of {sorted(CLUSTER_OF_RUNTIME)}")
    found: Cluster = request.getfixturevalue(CLUSTER_OF_RUNTIME[runtime])
    return found


@pytest.fixture(scope="session")
def operator_release(cluster: Cluster) -> OperatorRelease:
    """The operator's helm release, installed once for the session (not uninstalled at its
    end: the cluster goes with everything on it)."""
    return OperatorRelease(cluster)


@pytest.fixture(scope="module")
def operator(operator_release: OperatorRelease) -> Cluster:
    """The operator, installed with helm into its own namespace and serving, with its
    admission webhook (``helm install --wait`` returns once the webhook is registered)."""
    operator_release.ensure()
    return operator_release.cluster


@pytest.fixture
def no_webhook(operator: Cluster, operator_release: OperatorRelease) -> Iterator[Cluster]:
    """The operator without its admission webhook for one test: jobs reach it unchecked."""
    with operator_release.without_webhook():
        yield operator


@pytest.fixture
def no_operator(cluster: Cluster, operator_release: OperatorRelease) -> Cluster:
    """The cluster without the operator (such tests run last)."""
    operator_release.uninstall()
    return cluster
