"""The pod reconciler's view of its pods' health checks: verdicts heard, pods that passed, and
pods not judged in time."""

from __future__ import annotations

import pytest

from elasticjob.operator.health_gate import HealthGate, overdue_checks
from elasticjob.operator.pods import PodState, PodView
from elasticjob.wire.health import HealthVerdict, VerdictStatus


def pod(name: str, state: PodState = PodState.RUNNING, *, unchecked: bool = True) -> PodView:
    return PodView(name, state, f"node-{name}", None, "", unchecked=unchecked)


@pytest.mark.parametrize(
    ("view", "since", "expected"),
    [
        pytest.param(pod("a"), 100.0, [], id="running for 50 s: within the timeout"),
        pytest.param(pod("a"), 90.0, ["a"], id="running for 60 s: overdue"),
        pytest.param(pod("a"), None, [], id="first seen running now"),
        pytest.param(pod("a", unchecked=False), 0.0, [], id="passed: never overdue"),
        pytest.param(pod("a", PodState.PENDING), 0.0, [], id="not running: its time has not begun"),
        pytest.param(pod("a", PodState.FAILED), 0.0, [], id="failed: reported as failed already"),
    ],
)
def test_a_pod_not_judged_within_the_timeout_of_running_is_overdue(
    view: PodView, since: float | None, expected: list[str]
) -> None:
    running_since = {} if since is None else {"a": since}
    assert overdue_checks({"a": view}, running_since, now=150.0, timeout_s=60.0) == expected


def test_verdicts_are_taken_once_and_a_passed_pod_is_a_host_once_labelled() -> None:
    woken: list[bool] = []
    gate = HealthGate(lambda: woken.append(True))
    passed = HealthVerdict(status=VerdictStatus.PASSED, reason="compute 1.00x")
    failed = HealthVerdict(status=VerdictStatus.FAILED, reason="compute 0.10x")
    gate.on_health_verdict("a", passed, 3.0, None)
    gate.on_health_verdict("b", failed, 4.0, None)
    assert len(woken) == 2
    heard = gate.take_verdicts()
    assert [(h.pod, h.passed, h.seconds) for h in heard] == [("a", True, 3.0), ("b", False, 4.0)]
    assert gate.take_verdicts() == []
    views = gate.observe({"a": pod("a"), "c": pod("c")}, now=10.0)
    assert views["a"].unchecked, "no host until its pod is labelled (its check waits for it)"
    assert gate.to_label() == ["a"]
    gate.labelled("a")
    assert gate.to_label() == []
    views = gate.observe({"a": pod("a"), "c": pod("c")}, now=10.0)
    assert not views["a"].unchecked and views["c"].unchecked
    assert gate.overdue(views, now=10.0 + 59.0, timeout_s=60.0) == []
    assert gate.overdue(views, now=10.0 + 60.0, timeout_s=60.0) == ["c"]
    gate.observe({}, now=80.0)  # every pod gone: nothing is kept of them
    assert gate.overdue({"c": pod("c")}, now=80.0, timeout_s=60.0) == []
