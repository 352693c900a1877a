"""Table tests of the health check's decisions: when a cohort closes, and every verdict."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from elasticjob.rendezvous.health_rule import HealthPolicy, decide_gather, judge_cohort
from elasticjob.wire.health import HealthFigures, HealthProblem, HealthReport, VerdictStatus

P, F, R = VerdictStatus.PASSED, VerdictStatus.FAILED, VerdictStatus.RETRY
POLICY = HealthPolicy(min_relative=0.5, timeout_s=60.0, max_attempts=2)


@pytest.mark.parametrize(
    ("still_expected", "opened_at", "now", "expected"),
    [
        pytest.param(0, 10.0, 10.0, None, id="every-expected-pod-asked: closes at once"),
        pytest.param(2, 10.0, 11.0, 15.0, id="pods still expected: gathers until 5 s passed"),
        pytest.param(2, 10.0, 15.0, None, id="gathered 5 s: closes without the late pods"),
        pytest.param(-1, 10.0, 10.0, None, id="more asked than expected: closes"),
    ],
)
def test_a_cohort_gathers_until_every_expected_pod_asked_or_for_five_seconds(
    still_expected: int, opened_at: float, now: float, expected: float | None
) -> None:
    assert decide_gather(still_expected, opened_at, now, gather_s=5.0) == expected


def figures(compute: float = 10.0, copy: float = 5.0, device: str = "cpu") -> HealthFigures:
    return HealthFigures(device=device, compute_gflops=compute, copy_gbps=copy)


def measured(
    host: str, compute: float = 10.0, copy: float = 5.0, device: str = "cpu"
) -> HealthReport:
    return HealthReport(
        hostname=host, cohort=1, seconds=3.0, figures=figures(compute, copy, device)
    )


def broken(host: str, problem: HealthProblem) -> HealthReport:
    return HealthReport(hostname=host, cohort=1, seconds=3.0, problem=problem, message="boom")


COLLECTIVE, BENCHMARK = HealthProblem.COLLECTIVE, HealthProblem.BENCHMARK


@pytest.mark.parametrize(
    ("members", "reports", "history", "attempts", "gone", "expected"),
    [
        pytest.param("a", {"a": measured("a")}, [], {}, (), {"a": P}, id="alone, no peers: passes"),
        pytest.param(
            "abc",
            {"a": measured("a"), "b": measured("b", 9.0), "c": measured("c", 11.0)},
            [],
            {},
            (),
            {"a": P, "b": P, "c": P},
            id="three alike: all pass",
        ),
        pytest.param(
            "abc",
            {"a": measured("a"), "b": measured("b"), "c": measured("c", 2.0)},
            [],
            {},
            (),
            {"a": P, "b": P, "c": F},
            id="compute far below the others: fails, the others pass",
        ),
        pytest.param(
            "ab",
            {"a": measured("a"), "b": measured("b", copy=1.0)},
            [],
            {},
            (),
            {"a": P, "b": F},
            id="two, one copies at a fifth: the slow one fails (peers exclude itself)",
        ),
        pytest.param(
            "a",
            {"a": measured("a", 4.0)},
            [figures(), figures(), figures(12.0)],
            {},
            (),
            {"a": F},
            id="alone, below the job's earlier pods: fails",
        ),
        pytest.param(
            "a",
            {"a": measured("a", 4.0, device="cuda")},
            [figures(), figures()],
            {},
            (),
            {"a": P},
            id="peers on another device kind are no peers",
        ),
        pytest.param(
            "ab",
            {"a": measured("a")},
            [],
            {},
            (),
            {"a": P, "b": F},
            id="a member that never reported fails",
        ),
        pytest.param(
            "ab",
            {"a": broken("a", COLLECTIVE)},
            [],
            {},
            "b",
            {"a": R, "b": F},
            id="peer gone, collective broken: the gone one fails, the other checks again",
        ),
        pytest.param(
            "ab",
            {"a": broken("a", COLLECTIVE), "b": broken("b", BENCHMARK)},
            [],
            {},
            (),
            {"a": R, "b": F},
            id="a broken benchmark fails its pod and excuses the collective's others",
        ),
        pytest.param(
            "abc",
            {"a": measured("a"), "b": measured("b"), "c": broken("c", COLLECTIVE)},
            [],
            {},
            (),
            {"a": P, "b": P, "c": F},
            id="the collective failed on one alone: that one fails",
        ),
        pytest.param(
            "ab",
            {"a": broken("a", COLLECTIVE), "b": broken("b", COLLECTIVE)},
            [],
            {"a": 1, "b": 1},
            (),
            {"a": R, "b": R},
            id="the collective failed on all: everyone checks again",
        ),
        pytest.param(
            "ab",
            {"a": broken("a", COLLECTIVE), "b": broken("b", COLLECTIVE)},
            [],
            {"a": 2, "b": 1},
            (),
            {"a": F, "b": R},
            id="the collective failed in as many cohorts as allowed: fails",
        ),
    ],
)
def test_each_member_is_judged_against_its_peers_median(
    members: str,
    reports: Mapping[str, HealthReport],
    history: list[HealthFigures],
    attempts: Mapping[str, int],
    gone: str,
    expected: Mapping[str, VerdictStatus],
) -> None:
    verdicts = judge_cohort(list(members), reports, history, attempts, POLICY, gone=set(gone))
    assert {host: v.status for host, v in verdicts.items()} == expected
    for verdict in verdicts.values():
        assert verdict.reason


def test_a_failure_says_which_figure_fell_short_and_by_how_much() -> None:
    verdicts = judge_cohort(
        ["a", "b", "c"],
        {"a": measured("a"), "b": measured("b"), "c": measured("c", 2.0)},
        [],
        {},
        POLICY,
    )
    assert verdicts["c"].reason.startswith("compute 0.20x of its peers' median (2 vs 10 GFLOP/s")
    assert verdicts["a"].reason == "compute 1.67x, copy 1.00x of its 2 peers' median"
