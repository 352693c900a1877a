"""Per-job bounds: sized from the job's maximum worker count, with 10x headroom."""

from __future__ import annotations

import pytest

from elasticjob.rendezvous.limits import (
    HEADROOM,
    LONG_POLLS_PER_WORKER,
    NORMAL_REQUESTS_PER_WORKER_S,
    JobLimits,
    TokenBucket,
)
from tests.support.clock import FakeClock


@pytest.mark.parametrize(
    ("max_workers", "rate", "long_polls"),
    [(1, 100.0, 20), (2, 100.0, 40), (4, 120.0, 80), (1024, 30720.0, 20480)],
)
def test_bounds_follow_the_maximum_worker_count(
    max_workers: int, rate: float, long_polls: int
) -> None:
    limits = JobLimits.for_workers(max_workers)
    assert (limits.requests_per_s, limits.long_polls) == (rate, long_polls)
    assert limits.burst == 2 * rate


def test_a_1024_worker_job_has_ten_times_its_normal_traffic() -> None:
    limits = JobLimits.for_workers(1024)
    # every worker: a heartbeat a second, a notices poll a second, one more request a second
    normal_rate = 1024 * NORMAL_REQUESTS_PER_WORKER_S
    assert limits.requests_per_s >= HEADROOM * normal_rate
    assert limits.long_polls >= HEADROOM * 1024 * LONG_POLLS_PER_WORKER


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


def test_ten_times_the_normal_traffic_of_1024_workers_passes_the_rate() -> None:
    """10 s of 1,024 workers each sending 30 requests a second (10x a heartbeat, a notices
    poll and one more request a second), evenly spread: none is refused."""
    clock = FakeClock(50.0)
    limits = JobLimits.for_workers(1024)
    bucket = TokenBucket(limits.requests_per_s, limits.burst, clock)
    per_second = HEADROOM * NORMAL_REQUESTS_PER_WORKER_S * 1024
    refused = 0
    for _ in range(10):
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
