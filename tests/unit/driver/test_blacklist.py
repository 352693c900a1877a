"""The one blacklist: exponential cooldown, expiry, restore after a restart."""

from __future__ import annotations

import pytest

from elasticjob.driver.blacklist import Blacklist, BlacklistPolicy
from tests.support.clock import FakeClock

POLICY = BlacklistPolicy(cooldown_min_s=10.0, cooldown_max_s=60.0)


@pytest.mark.parametrize(
    ("strikes", "expected"), [(1, 10.0), (2, 20.0), (3, 40.0), (4, 60.0), (50, 60.0), (5000, 60.0)]
)
def test_cooldown_doubles_up_to_the_maximum(strikes: int, expected: float) -> None:
    assert POLICY.cooldown_s(strikes) == expected


@pytest.mark.parametrize(("low", "high"), [(0.0, 1.0), (-1.0, 1.0), (5.0, 1.0)])
def test_policy_refuses_a_bad_range(low: float, high: float) -> None:
    with pytest.raises(ValueError, match="0 < min <= max"):
        BlacklistPolicy(low, high)


def test_cooldown_needs_a_strike() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        POLICY.cooldown_s(0)


def test_add_counts_strikes_and_expires() -> None:
    clock = FakeClock(100.0)
    nodes = Blacklist[str](POLICY, clock)
    assert nodes.add("n1") == 110.0
    assert "n1" in nodes and "n2" not in nodes
    assert dict(nodes.active()) == {"n1": 110.0}
    clock.now = 110.0
    assert "n1" not in nodes
    assert nodes.expire() == ["n1"]
    assert nodes.expire() == []
    assert nodes.strikes("n1") == 1
    assert nodes.add("n1") == 130.0, "the second blacklisting lasts twice as long"
    assert nodes.strikes("n1") == 2


def test_restore_keeps_the_later_end_and_the_strikes() -> None:
    clock = FakeClock(100.0)
    nodes = Blacklist[str](POLICY, clock)
    nodes.restore("n1", until=150.0, strikes=2)
    assert dict(nodes.active()) == {"n1": 150.0}
    nodes.restore("n1", until=120.0)
    assert dict(nodes.active()) == {"n1": 150.0}, "an earlier recorded end does not shorten it"
    assert nodes.strikes("n1") == 2
    assert nodes.add("n1") == 140.0, "the next blacklisting is the third"
    clock.now = 160.0
    assert dict(nodes.active()) == {}


def test_restore_of_an_ended_cooldown_is_not_active() -> None:
    clock = FakeClock(100.0)
    nodes = Blacklist[str](POLICY, clock)
    nodes.restore("n1", until=50.0)
    assert "n1" not in nodes
