"""Per-job bounds: sized from the job's maximum worker count, with 10x headroom."""

from __future__ import annotations

import pytest

from elasticjob.rendezvous.limits import (
    HEADROOM,
    LONG_POLLS_PER_WORKER,
    MAX_JOB_SHARE,
    SERVICE_REQUESTS_PER_S,
    InFlight,
    JobLimits,
    TokenBucket,
)
from elasticjob.rendezvous.rendezvous_types import Refusal, RequestRefused
from tests.support.clock import FakeClock


@pytest.mark.parametrize(
    ("max_workers", "rate", "burst", "long_polls", "bodies"),
    [
        pytest.param(1, 100.0, 200.0, 20, 16, id="one worker: the minimums"),
        pytest.param(2, 100.0, 200.0, 40, 16, id="two"),
        pytest.param(4, 120.0, 240.0, 80, 16, id="four: ten times their traffic"),
        pytest.param(32, 960.0, 1920.0, 640, 64, id="32: two bodies each"),
        pytest.param(64, 1400.0, 2800.0, 1280, 128, id="64: the rate at half the service"),
        pytest.param(1024, 1536.0, 4096.0, 20480, 256, id="1,024: beats 1.5x, burst 4 each"),
    ],
)
def test_bounds_follow_the_maximum_worker_count_up_to_a_share_of_the_service(
    max_workers: int, rate: float, burst: float, long_polls: int, bodies: int
) -> None:
    limits = JobLimits.for_workers(max_workers)
    assert (limits.requests_per_s, limits.burst) == (rate, burst)
    assert (limits.long_polls, limits.bodies) == (long_polls, bodies)


@pytest.mark.parametrize(
    ("max_workers", "interval_s", "rate"),
    [
        pytest.param(64, 1.0, MAX_JOB_SHARE * SERVICE_REQUESTS_PER_S, id="64 at 1 s: half"),
        pytest.param(512, 2.0, MAX_JOB_SHARE * SERVICE_REQUESTS_PER_S, id="512 at 2 s: half"),
        pytest.param(512, None, MAX_JOB_SHARE * SERVICE_REQUESTS_PER_S, id="no beats: half"),
        pytest.param(1024, 0.4, 1.5 * 1024 / 0.4, id="1,024 at 0.4 s: their beats, 1.5x"),
        pytest.param(100_000, 2.0, 1.5 * 100_000 / 2.0, id="100,000 at 2 s: their beats"),
    ],
)
def test_no_job_takes_more_than_half_the_service_unless_its_heartbeats_need_it(
    max_workers: int, interval_s: float | None, rate: float
) -> None:
    limits = JobLimits.for_workers(max_workers, interval_s)
    assert limits.requests_per_s == pytest.approx(rate)


def test_a_1024_worker_job_keeps_its_normal_traffic_and_a_failures_burst() -> None:
    limits = JobLimits.for_workers(1024)
    # every worker: a heartbeat a second, progress from rank 0 (docs/scale.md, idle)
    assert limits.requests_per_s >= 1024 + 1
    # a failure: about 3 requests per survivor at once
    assert limits.burst >= 3 * 1023
    assert limits.long_polls >= HEADROOM * 1024 * LONG_POLLS_PER_WORKER


def test_in_flight_refuses_beyond_its_limit_and_lets_go() -> None:
    bodies = InFlight(2)
    with bodies.hold(), bodies.hold():
        with pytest.raises(RequestRefused) as refused, bodies.hold():
            pass
        assert refused.value.refusal is Refusal.TOO_MANY_BODIES and bodies.held == 2
    assert bodies.held == 0


def test_no_workers_is_refused() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        JobLimits.for_workers(0)


@pytest.mark.parametrize(
    ("taken", "advance", "expected"),
    [
        (0, 0.0, 0.0),  # full bucket: served
        (4, 0.0, 0.5),  # empty: a token in 1/rate s
        (4, 0.25, 0.25),  # half a token back: the other half to wait
        (4, 0.5, 0.0),  # a token back: served
        (4, 100.0, 0.0),  # refilled, capped at the burst
    ],
)
def test_token_bucket(taken: int, advance: float, expected: float) -> None:
    clock = FakeClock(50.0)
    bucket = TokenBucket(rate=2.0, burst=4.0, clock=clock)
    for _ in range(taken):
        assert bucket.take() == 0.0
    clock.now += advance
    assert bucket.take() == pytest.approx(expected)


def test_token_bucket_refills_to_its_burst_only() -> None:
    clock = FakeClock(50.0)
    bucket = TokenBucket(rate=2.0, burst=4.0, clock=clock)
    clock.now += 1000
    served = 0
    while bucket.take() == 0.0:
        served += 1
    assert served == 4


@pytest.mark.parametrize("interval_s", [2.0, 1.0, 0.4, 0.1])
def test_the_normal_traffic_of_1024_workers_and_a_failure_pass_the_rate(interval_s: float) -> None:
    """10 s of 1,024 workers each beating every ``interval_s`` and rank 0's progress, evenly
    spread, with a failure at 5 s (3 requests from each of the 1,023 survivors at once): none
    is refused (a worker whose beats are refused would be taken for dead)."""
    clock = FakeClock(50.0)
    limits = JobLimits.for_workers(1024, interval_s)
    bucket = TokenBucket(limits.requests_per_s, limits.burst, clock)
    per_second = round(1024 / interval_s) + 1
    refused = 0
    for second in range(10):
        if second == 5:
            refused += sum(bucket.take() > 0 for _ in range(3 * 1023))
        for _ in range(per_second):
            clock.now += 1.0 / per_second
            refused += bucket.take() > 0
    assert refused == 0


def test_a_flood_of_one_small_job_is_cut_to_its_rate() -> None:
    clock = FakeClock(50.0)
    limits = JobLimits.for_workers(2)
    bucket = TokenBucket(limits.requests_per_s, limits.burst, clock)
    served = 0
    for _ in range(10_000):  # 10,000 requests in 1 s
        clock.now += 1e-4
        served += bucket.take() == 0.0
    assert served == pytest.approx(limits.burst + limits.requests_per_s, abs=2)
