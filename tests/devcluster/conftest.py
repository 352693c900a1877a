"""devcluster's own tests, marked ``devcluster``; the cluster fixtures are in
tests/support/cluster_fixtures.py."""

from __future__ import annotations

from pathlib import Path

import pytest

CLUSTER_FIXTURES = "tests.support.cluster_fixtures"


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
