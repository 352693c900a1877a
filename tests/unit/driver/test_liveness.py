"""The liveness decision: which worker processes stopped beating."""

from __future__ import annotations

import pytest

from elasticjob.driver.liveness import heartbeat_interval_s, hung_workers
from elasticjob.wire import WorkerId

A = WorkerId("host-a", 0)
B = WorkerId("host-b", 0)
C = WorkerId("host-a", 1)
NOW = 1000.0


@pytest.mark.parametrize(
    ("beats", "timeout", "hung"),
    [
        pytest.param({}, 5.0, set(), id="no workers"),
        pytest.param({A: NOW - 1.0, B: NOW - 4.9}, 5.0, set(), id="all beat within the bound"),
        pytest.param({A: NOW - 5.0}, 5.0, set(), id="silent exactly the bound: not yet"),
        pytest.param({A: NOW - 5.01, B: NOW}, 5.0, {A}, id="one silent past the bound"),
        pytest.param({A: NOW - 60, C: NOW - 6, B: NOW - 1}, 5.0, {A, C}, id="two silent"),
        pytest.param({A: None, B: NOW - 1}, 5.0, set(), id="never beat (starting): not hung"),
        pytest.param({A: NOW - 600.0}, None, set(), id="eviction turned off"),
        pytest.param({A: NOW + 1.0}, 5.0, set(), id="beat stamped after now"),
    ],
)
def test_hung_workers(
    beats: dict[WorkerId, float | None], timeout: float | None, hung: set[WorkerId]
) -> None:
    assert hung_workers(beats, timeout_s=timeout, now=NOW) == hung


@pytest.mark.parametrize(
    ("timeout", "interval"),
    [
        pytest.param(5.0, 1.0, id="default: five beats per timeout"),
        pytest.param(2.5, 0.5, id="short timeout"),
        pytest.param(0.2, 0.1, id="floor"),
        pytest.param(60.0, 2.0, id="ceiling"),
        pytest.param(None, None, id="no eviction, no beat"),
    ],
)
def test_heartbeat_interval(timeout: float | None, interval: float | None) -> None:
    got = heartbeat_interval_s(timeout)
    assert got is None if interval is None else got == pytest.approx(interval)


@pytest.mark.parametrize("timeout", [0.0, -1.0])
def test_heartbeat_interval_needs_a_positive_timeout(timeout: float) -> None:
    with pytest.raises(ValueError, match="heartbeat timeout"):
        heartbeat_interval_s(timeout)
