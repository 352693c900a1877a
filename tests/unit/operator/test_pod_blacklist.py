"""The job's one blacklist under the operator: nodes or pods per scope, struck once per
failed pod whoever learns of the failure first (the controller or the driver)."""

from __future__ import annotations

import pytest

from elasticjob.driver.blacklist import BlacklistPolicy
from elasticjob.operator.api import BlacklistScope
from elasticjob.operator.pod_blacklist import PodBlacklist
from tests.support.clock import FakeClock

NODES = {"a": "n1", "b": "n1", "c": "n2", "pending": None}


def blacklist(scope: BlacklistScope, clock: FakeClock) -> PodBlacklist:
    return PodBlacklist(scope, BlacklistPolicy(10.0, 40.0), clock, NODES.get)


def test_a_failed_pod_strikes_its_node_once_whoever_reports_it() -> None:
    clock = FakeClock(100.0)
    nodes = blacklist(BlacklistScope.NODE, clock)
    exclusion = nodes.exclude("a")
    assert exclusion is not None and (exclusion.key, exclusion.until) == ("n1", 110.0)
    assert nodes.exclude("a") is None, "the driver's report of the same failure"
    assert nodes.keys.strikes("n1") == 1
    assert "a" in nodes and "b" in nodes and "c" not in nodes, "b runs on the same node"
    second = nodes.exclude("b")
    assert second is not None and second.until == 120.0, "another pod's failure: a strike"
    clock.now += 21.0
    assert "a" not in nodes and list(nodes.expire()) == ["n1"]


@pytest.mark.parametrize(
    ("scope", "pod", "key"),
    [
        (BlacklistScope.NODE, "c", "n2"),
        (BlacklistScope.POD, "c", "c"),
        (BlacklistScope.NODE, "pending", None),
        (BlacklistScope.POD, "pending", "pending"),
    ],
)
def test_what_a_failure_keeps_out_follows_the_scope(
    scope: BlacklistScope, pod: str, key: str | None
) -> None:
    kept = blacklist(scope, FakeClock(100.0))
    exclusion = kept.exclude(pod)
    assert (exclusion.key if exclusion else None) == key
    assert list(kept.active()) == ([key] if key else [])
