"""The liveness decision: which worker processes stopped beating."""

from __future__ import annotations

import math

import pytest

from elasticjob.driver.liveness import (
    LOOP_LAG_S,
    REACH_GRACE_S,
    Reachability,
    heartbeat_interval_s,
    hung_workers,
)
from elasticjob.wire.messages import WorkerId

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
    ("beats", "counts_from", "hung"),
    [
        pytest.param({A: NOW - 60, B: NOW - 1}, None, set(), id="driver unreachable: none"),
        pytest.param({A: NOW - 60}, NOW - 4, set(), id="silence counted from the grace end"),
        pytest.param({A: NOW - 60}, NOW - 6, {A}, id="silent past the grace end"),
        pytest.param({A: NOW - 6, B: NOW - 1}, NOW - 600, {A}, id="grace long past"),
        pytest.param({A: None}, NOW - 600, set(), id="never beat (starting)"),
    ],
)
def test_hung_workers_counted_from(
    beats: dict[WorkerId, float | None], counts_from: float | None, hung: set[WorkerId]
) -> None:
    assert hung_workers(beats, timeout_s=5.0, now=NOW, counts_from=counts_from) == hung


@pytest.mark.parametrize(
    ("moves", "since", "counts_from"),
    [
        pytest.param([], -math.inf, -math.inf, id="reachable from the start"),
        pytest.param([(False, 10.0)], None, None, id="unreachable"),
        pytest.param([(False, 10.0), (True, 20.0)], 20.0, 20.0 + REACH_GRACE_S, id="again"),
        pytest.param([(False, 10.0), (False, 15.0)], None, None, id="still unreachable"),
        pytest.param(
            [(False, 1.0), (True, 20.0), (True, 25.0)], 20.0, 20.0 + REACH_GRACE_S, id="still"
        ),
    ],
)
def test_reachability(
    moves: list[tuple[bool, float]], since: float | None, counts_from: float | None
) -> None:
    reachability = Reachability()
    for reachable, now in moves:
        reachability.update(reachable, now)
    assert reachability.since == since
    assert reachability.silence_counts_from() == counts_from


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


@pytest.mark.parametrize(
    ("reachable", "lateness", "counts", "counts_from"),
    [
        pytest.param(True, 0.2, False, -math.inf, id="on time: silence counts as before"),
        pytest.param(True, LOOP_LAG_S, True, 50.0, id="late: silence counts from now"),
        pytest.param(False, 5.0, True, None, id="unreachable: still not at all"),
    ],
)
def test_a_late_loop_restarts_the_silence(
    reachable: bool, lateness: float, counts: bool, counts_from: float | None
) -> None:
    reachability = Reachability()
    reachability.update(reachable, 10.0)
    assert reachability.loop_ran_late(lateness, 50.0) is counts
    assert reachability.silence_counts_from() == counts_from


def test_silence_counts_from_the_later_of_the_grace_and_the_lag() -> None:
    reachability = Reachability()
    reachability.update(False, 10.0)
    reachability.update(True, 20.0)
    reachability.loop_ran_late(3.0, 25.0)
    assert reachability.silence_counts_from() == 20.0 + REACH_GRACE_S
    reachability.loop_ran_late(3.0, 60.0)
    assert reachability.silence_counts_from() == 60.0
