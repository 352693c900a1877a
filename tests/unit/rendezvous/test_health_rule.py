"""Table tests of the health check's decisions: when a cohort closes, and every verdict."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from pydantic import ValidationError

from elasticjob.rendezvous.health_rule import (
    HealthPolicy,
    decide_gather,
    judge_cohort,
    kept_as_peers,
)
from elasticjob.wire.health import (
    HealthFigures,
    HealthProblem,
    HealthReport,
    HealthVerdict,
    VerdictStatus,
)

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
            {"a": measured("a", 4.0)},
            [figures()],
            {},
            (),
            {"a": P},
            id="alone, one earlier pod: too few to set the bar, passes",
        ),
        pytest.param(
            "ab",
            {"a": measured("a", 4.0), "b": measured("b", 5.0)},
            [figures()],
            {},
            (),
            {"a": P, "b": P},
            id="one earlier pod: compared within the cohort only",
        ),
        pytest.param(
            "abc",
            {"a": measured("a", 50.0), "b": measured("b", 45.0), "c": measured("c", 1e7)},
            [],
            {},
            (),
            {"a": P, "b": P, "c": P},
            id="one member reports the cap: the median of the others holds the bar",
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
    lower_median = "compute 5.00x, copy 1.00x of its 2 peers' median"
    assert verdicts["a"].reason == lower_median


@pytest.mark.parametrize(
    ("reports", "failed", "history", "kept"),
    [
        pytest.param({"a": measured("a")}, "", [], "", id="a cohort of one: nothing kept"),
        pytest.param(
            {"a": measured("a")},
            "",
            [figures(), figures()],
            "",
            id="alone though compared with the history: nothing kept",
        ),
        pytest.param(
            {"a": measured("a"), "b": measured("b", 12.0)},
            "",
            [],
            "ab",
            id="two alike: both kept",
        ),
        pytest.param(
            {"a": measured("a"), "b": measured("b", 4.0)},
            "b",
            [],
            "a",
            id="a failed pod's figures are not kept",
        ),
        pytest.param(
            {"a": measured("a"), "b": measured("b", 30.0)},
            "",
            [],
            "ab",
            id="three times faster: within the factor, kept",
        ),
        pytest.param(
            {"a": measured("a"), "b": measured("b", 1e7)},
            "a",
            [],
            "",
            id="a reported figure far above its peers: passes, not kept",
        ),
        pytest.param(
            {"a": measured("a"), "b": measured("b", 45.0)},
            "",
            [figures(), figures(), figures()],
            "a",
            id="above the history and cohort's median by more than the factor: not kept",
        ),
        pytest.param(
            {"a": measured("a"), "b": measured("b", copy=25.0)},
            "",
            [],
            "",
            id="one figure out of the factor is enough: copy 5x, neither kept",
        ),
        pytest.param(
            {"a": measured("a"), "b": broken("b", COLLECTIVE)},
            "b",
            [figures(), figures()],
            "",
            id="one measured member: nothing kept",
        ),
    ],
)
def test_only_a_passed_pod_within_the_factor_of_a_cohort_of_two_or_more_joins_the_history(
    reports: Mapping[str, HealthReport],
    failed: str,
    history: list[HealthFigures],
    kept: str,
) -> None:
    verdicts = {
        host: HealthVerdict(status=F if host in failed else P, reason="judged") for host in reports
    }
    expected = [reports[host].figures for host in kept]
    assert kept_as_peers(reports, verdicts, history) == expected


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("compute_gflops", 1e300, id="compute 1e300"),
        pytest.param("compute_gflops", 1.1e7, id="compute over 10 PFLOP/s"),
        pytest.param("copy_gbps", 1.1e5, id="copy over 100 TB/s"),
        pytest.param("copy_gbps", 0.0, id="copy zero"),
    ],
)
def test_a_figure_beyond_its_cap_is_refused_by_the_wire_model(field: str, value: float) -> None:
    raw = {"device": "cpu", "compute_gflops": 10.0, "copy_gbps": 5.0, field: value}
    with pytest.raises(ValidationError, match=field):
        HealthFigures.model_validate(raw)
