"""Tests of one job's health checks at the service (cohorts, long-polls, verdicts), driven
with a fake clock and no HTTP."""

from __future__ import annotations

import asyncio

import pytest

from elasticjob.rendezvous.health_checks import HealthChecks
from elasticjob.rendezvous.health_rule import HealthPolicy
from elasticjob.rendezvous.rendezvous_types import Refusal, RequestRefused
from elasticjob.rendezvous.wakeup import LongPolls
from elasticjob.wire.health import (
    CohortRequest,
    HealthFigures,
    HealthProblem,
    HealthReport,
    VerdictStatus,
)
from tests.support.clock import FakeClock
from tests.support.health_checks import RecordedVerdicts
from tests.support.rendezvous_jobs import DEADLINE


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def verdicts() -> RecordedVerdicts:
    return RecordedVerdicts()


@pytest.fixture
def checks(clock: FakeClock, verdicts: RecordedVerdicts) -> HealthChecks:
    polls = LongPolls(100, lambda: False)
    checks = HealthChecks("job-a", HealthPolicy(timeout_s=60.0), verdicts, polls, clock)
    verdicts.checks = checks
    return checks


def checks_of(clock: FakeClock, verdicts: RecordedVerdicts, polls: int = 100) -> HealthChecks:
    """A job's checks whose listener admits nothing by itself."""
    return HealthChecks(
        "job-a", HealthPolicy(timeout_s=60.0), verdicts, LongPolls(polls, lambda: False), clock
    )


def asking(host: str, port: int = 1000, wait: float = 0.0) -> CohortRequest:
    return CohortRequest(hostname=host, address="10.0.0.1", store_port=port, wait_seconds=wait)


def measured(host: str, cohort: int, compute: float = 10.0, wait: float = 0.0) -> HealthReport:
    figures = HealthFigures(device="cpu", compute_gflops=compute, copy_gbps=5.0)
    return HealthReport(
        hostname=host, cohort=cohort, seconds=2.5, figures=figures, wait_seconds=wait
    )


def broken(host: str, cohort: int) -> HealthReport:
    return HealthReport(
        hostname=host,
        cohort=cohort,
        seconds=2.5,
        problem=HealthProblem.COLLECTIVE,
        message="the all-reduce timed out",
    )


async def test_pods_that_start_together_form_one_cohort_on_the_first_ones_store(
    checks: HealthChecks,
) -> None:
    checks.expect(["a", "b"])
    first = asyncio.create_task(checks.join(asking("a", 1111, wait=DEADLINE)))
    await asyncio.sleep(0)
    assert not first.done(), "a cohort waits for the pods expected to check"
    second = await asyncio.wait_for(checks.join(asking("b", 2222, wait=DEADLINE)), DEADLINE)
    a = await asyncio.wait_for(first, DEADLINE)
    assert (a.cohort, a.rank, a.size, a.store_port) == (1, 0, 2, 1111)
    assert (second.cohort, second.rank, second.size, second.store_port) == (1, 1, 2, 1111)
    assert a.deadline_seconds == 30.0, "half the timeout: judged before the operator's"
    assert a.store_prefix == second.store_prefix and a.store_prefix.startswith("job-a/health/")


async def test_a_cohort_closes_without_a_late_pod_after_gathering_five_seconds(
    checks: HealthChecks, clock: FakeClock
) -> None:
    checks.expect(["a", "b"])
    assert (await checks.join(asking("a"))).cohort == 0, "still gathering"
    clock.now += 5.0
    checks.tick()
    answer = await checks.join(asking("a"))
    assert (answer.cohort, answer.size) == (1, 1)
    late = await checks.join(asking("b"))
    assert (late.cohort, late.size) == (2, 1), "the last pod expected: its cohort closes at once"


async def test_a_cohort_is_judged_once_all_reported_and_later_pods_meet_its_figures(
    checks: HealthChecks, verdicts: RecordedVerdicts
) -> None:
    checks.expect(["a", "b"])
    await checks.join(asking("a"))
    assert (await checks.join(asking("b"))).cohort == 1
    waiting = asyncio.create_task(checks.report(measured("a", 1, wait=DEADLINE)))
    await asyncio.sleep(0)
    assert not waiting.done(), "judged only once the whole cohort reported"
    b = await checks.report(measured("b", 1, compute=9.0))
    assert b.status is VerdictStatus.PASSED
    assert (await asyncio.wait_for(waiting, DEADLINE)).status is VerdictStatus.PASSED
    assert verdicts.outcomes() == {
        "a": (VerdictStatus.PASSED, 2.5),
        "b": (VerdictStatus.PASSED, 2.5),
    }
    retried = await checks.report(measured("a", 1))
    assert retried.status is VerdictStatus.PASSED, "a retried report gets the same verdict"

    checks.expect(["c"])  # a replacement, alone, far slower than the pods before it
    assert (await checks.join(asking("c"))).cohort == 2
    c = await checks.report(measured("c", 2, compute=1.0))
    assert c.status is VerdictStatus.FAILED
    assert "compute 0.11x" in c.reason
    assert verdicts.outcomes()["c"] == (VerdictStatus.FAILED, 2.5)


async def test_requests_of_pods_not_awaiting_a_check_are_refused_and_change_nothing(
    checks: HealthChecks,
) -> None:
    with pytest.raises(RequestRefused) as refused:
        await checks.join(asking("a"))
    assert refused.value.refusal is Refusal.NOT_ADMITTED_YET  # retryable: not seen running yet
    checks.expect(["a", "b"])
    await checks.join(asking("a"))
    await checks.join(asking("b"))
    with pytest.raises(RequestRefused) as refused:
        await checks.report(measured("c", 1))
    assert refused.value.refusal is Refusal.NOT_ADMITTED_YET
    with pytest.raises(RequestRefused) as refused:
        await checks.report(measured("a", 7))
    assert refused.value.refusal is Refusal.INVALID_REPORT, "a is a member of cohort 1"
    await checks.report(measured("a", 1))
    await checks.report(measured("b", 1))
    with pytest.raises(RequestRefused) as refused:
        await checks.join(asking("a"))
    assert refused.value.refusal is Refusal.UNKNOWN_WORKER, "judged already"


async def test_a_report_to_a_service_that_does_not_know_its_cohort_is_told_to_check_again(
    checks: HealthChecks,
) -> None:
    checks.expect(["a"])  # the service restarted while the pod ran its check
    again = await checks.report(measured("a", 3))
    assert again.status is VerdictStatus.RETRY
    assert (await checks.join(asking("a"))).cohort == 1


async def test_a_member_whose_pod_is_gone_fails_and_excuses_its_cohorts_broken_collective(
    checks: HealthChecks, verdicts: RecordedVerdicts
) -> None:
    checks.expect(["a", "b"])
    await checks.join(asking("a"))
    await checks.join(asking("b"))
    waiting = asyncio.create_task(
        checks.report(broken("a", 1).model_copy(update={"wait_seconds": DEADLINE}))
    )
    await asyncio.sleep(0)
    checks.expect(["a"])  # b's pod failed
    again = await asyncio.wait_for(waiting, DEADLINE)
    assert again.status is VerdictStatus.RETRY
    assert verdicts.outcomes() == {}, "the front end carried b's end out itself"
    answer = await checks.join(asking("a"))
    assert (answer.cohort, answer.size) == (2, 1), "a checks again, alone"
    assert (await checks.report(measured("a", 2))).status is VerdictStatus.PASSED


async def test_a_cohort_is_judged_at_its_deadline_without_the_silent_member(
    checks: HealthChecks, clock: FakeClock, verdicts: RecordedVerdicts
) -> None:
    checks.expect(["a", "b"])
    await checks.join(asking("a"))
    await checks.join(asking("b"))
    pending = await checks.report(measured("a", 1))
    assert pending.status is VerdictStatus.PENDING
    clock.now += 30.0
    checks.tick()
    assert (await checks.report(measured("a", 1))).status is VerdictStatus.PASSED
    assert verdicts.outcomes()["b"] == (VerdictStatus.FAILED, None)


async def test_a_pod_that_passed_is_told_so_only_once_the_front_end_admitted_it(
    clock: FakeClock,
) -> None:
    verdicts = RecordedVerdicts()
    checks = checks_of(clock, verdicts)
    checks.expect(["a"])
    await checks.join(asking("a"))
    report = measured("a", 1, wait=DEADLINE)
    waiting = asyncio.create_task(checks.report(report))
    await asyncio.sleep(0)
    assert verdicts.outcomes() == {"a": (VerdictStatus.PASSED, 2.5)}
    assert not waiting.done(), "not told before its pod is labelled"
    assert (await checks.report(measured("a", 1))).status is VerdictStatus.PENDING
    checks.admitted("a")
    assert (await asyncio.wait_for(waiting, DEADLINE)).status is VerdictStatus.PASSED


async def test_a_cohort_of_a_restarted_service_gets_a_fresh_store_prefix(
    clock: FakeClock,
) -> None:
    prefixes = set()
    for _ in range(2):
        checks = checks_of(clock, RecordedVerdicts())
        checks.expect(["a"])
        prefixes.add((await checks.join(asking("a"))).store_prefix)
    assert len(prefixes) == 2


async def test_a_request_refused_for_too_many_waits_changes_nothing(clock: FakeClock) -> None:
    checks = checks_of(clock, RecordedVerdicts(), polls=1)
    checks.expect(["a", "b", "c"])
    held = asyncio.create_task(checks.join(asking("a", wait=DEADLINE)))
    await asyncio.sleep(0)
    with pytest.raises(RequestRefused) as refused:
        await checks.join(asking("b", wait=DEADLINE))
    assert refused.value.refusal is Refusal.TOO_MANY_WAITS
    clock.advance(5.0)
    checks.tick()
    assert (await asyncio.wait_for(held, DEADLINE)).size == 1, "b was not gathered"


async def test_a_closed_job_judges_nothing_more(clock: FakeClock) -> None:
    verdicts = RecordedVerdicts()
    checks = checks_of(clock, verdicts)
    checks.expect(["a", "b"])
    await checks.join(asking("a"))
    await checks.join(asking("b"))
    checks.close()
    clock.advance(60.0)
    checks.tick()
    assert verdicts.heard == {}


async def test_a_pod_that_reports_the_cap_alone_sets_no_bar_for_later_pods(
    checks: HealthChecks,
) -> None:
    checks.expect(["x"])  # alone: compared with no one, so its figures are not kept
    assert (await checks.join(asking("x"))).cohort == 1
    assert (await checks.report(measured("x", 1, compute=1e7))).status is VerdictStatus.PASSED
    checks.expect(["y"])
    assert (await checks.join(asking("y"))).cohort == 2
    honest = await checks.report(measured("y", 2, compute=50.0))
    assert honest.status is VerdictStatus.PASSED, honest.reason


async def test_an_outlier_of_a_cohort_passes_but_later_pods_meet_the_others_figures(
    checks: HealthChecks,
) -> None:
    checks.expect(["a", "b", "x"])
    for host in "abx":
        await checks.join(asking(host))
    await checks.report(measured("a", 1, compute=50.0))
    await checks.report(measured("b", 1, compute=55.0))
    assert (await checks.report(measured("x", 1, compute=1e7))).status is VerdictStatus.PASSED
    checks.expect(["y"])
    assert (await checks.join(asking("y"))).cohort == 2
    verdict = await checks.report(measured("y", 2, compute=40.0))
    assert verdict.status is VerdictStatus.PASSED, verdict.reason
    assert verdict.reason.startswith("compute 0.80x, copy 1.00x of its 2 peers' median")


async def test_a_cohort_waits_for_a_pod_that_is_not_running_yet(
    checks: HealthChecks, clock: FakeClock
) -> None:
    """Two pods started together, the second slower to run: the first one's cohort waits for
    it (up to the gathering time), so that the two are checked together and compared."""
    checks.expect(["a"], coming=["b"])
    assert (await checks.join(asking("a"))).cohort == 0, "still gathering: b is coming"
    clock.now += 2.0
    checks.expect(["a", "b"])
    together = await checks.join(asking("b"))
    assert (together.cohort, together.size) == (1, 2)
    checks.expect(["c"], coming=[])
    alone = await checks.join(asking("c"))
    assert (alone.cohort, alone.size) == (2, 1), "nothing else coming: it closes at once"


async def test_a_pod_that_never_runs_holds_a_cohort_for_the_gathering_time_only(
    checks: HealthChecks, clock: FakeClock
) -> None:
    checks.expect(["a"], coming=["b"])
    assert (await checks.join(asking("a"))).cohort == 0
    clock.now += 5.0
    checks.tick()
    answer = await checks.join(asking("a"))
    assert (answer.cohort, answer.size) == (1, 1)
