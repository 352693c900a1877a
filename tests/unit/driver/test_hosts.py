"""HostManager: stable host order, blacklisting with exponential cooldown."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from elasticjob.driver.blacklist import Blacklist, BlacklistPolicy
from elasticjob.driver.discovery import HostDiscovery
from elasticjob.driver.driver_types import DiscoveryError, HostUpdate
from elasticjob.driver.host_manager import HostManager
from tests.support.clock import FakeClock


class FakeDiscovery(HostDiscovery):
    def __init__(self, hosts: dict[str, int] | None = None) -> None:
        self.hosts: dict[str, int] = dict(hosts or {})
        self.error: DiscoveryError | None = None

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        if self.error is not None:
            raise self.error
        return dict(self.hosts)


POLICY = BlacklistPolicy(cooldown_min_s=10.0, cooldown_max_s=60.0)


class Manager(HostManager):
    """A host manager told what a discovery finds, as a front end tells it."""

    def __init__(self, discovery: FakeDiscovery, clock: FakeClock) -> None:
        super().__init__(Blacklist[str](POLICY, clock))
        self.discovery = discovery

    def discover(self) -> HostUpdate:
        try:
            found = self.discovery.find_available_hosts_and_slots()
        except DiscoveryError as exc:
            self.discovery_failed(str(exc))
            raise
        return self.update(found)

    def exclude_until(self, host: str) -> float:
        exclusion = self.exclude(host)
        assert exclusion is not None and exclusion.key == host
        return exclusion.until


def make(hosts: dict[str, int]) -> tuple[Manager, FakeDiscovery, FakeClock]:
    discovery = FakeDiscovery(hosts)
    clock = FakeClock()
    return Manager(discovery, clock), discovery, clock


def names(manager: HostManager) -> list[str]:
    return [host for host, _ in manager.current_hosts]


def test_first_update_adds_hosts_in_discovery_order() -> None:
    manager, _, _ = make({"b": 2, "a": 1, "c": 4})
    assert not manager.current_hosts
    assert manager.discover() == HostUpdate(added=("b", "a", "c"))
    assert manager.current_hosts == (("b", 2), ("a", 1), ("c", 4))


def test_unchanged_discovery_is_an_empty_update() -> None:
    manager, _, _ = make({"a": 1})
    manager.discover()
    update = manager.discover()
    assert update == HostUpdate()
    assert not update


def test_survivors_keep_order_and_new_hosts_go_last() -> None:
    manager, discovery, _ = make({"a": 1, "b": 1, "c": 1})
    manager.discover()
    discovery.hosts = {"d": 1, "c": 1, "a": 1}
    assert manager.discover() == HostUpdate(added=("d",), removed=("b",))
    assert names(manager) == ["a", "c", "d"]


def test_returning_host_goes_last() -> None:
    manager, discovery, _ = make({"a": 1, "b": 1})
    manager.discover()
    discovery.hosts = {"b": 1}
    manager.discover()
    discovery.hosts = {"a": 1, "b": 1}
    assert manager.discover() == HostUpdate(added=("a",))
    assert names(manager) == ["b", "a"]


def test_slot_change_keeps_place_and_is_not_an_update() -> None:
    manager, discovery, _ = make({"a": 1, "b": 2})
    manager.discover()
    discovery.hosts = {"b": 4, "a": 1}
    assert manager.discover() == HostUpdate()
    assert manager.current_hosts == (("a", 1), ("b", 4))


def test_discovery_error_propagates_and_keeps_view() -> None:
    manager, discovery, _ = make({"a": 1})
    manager.discover()
    discovery.error = DiscoveryError("script failed")
    with pytest.raises(DiscoveryError, match="script failed"):
        manager.discover()
    assert names(manager) == ["a"]


@pytest.mark.parametrize(
    ("strikes", "expected"),
    [
        pytest.param(1, 10.0, id="first-is-min"),
        pytest.param(2, 20.0, id="second-doubles"),
        pytest.param(3, 40.0, id="third-doubles-again"),
        pytest.param(4, 60.0, id="fourth-capped-at-max"),
        pytest.param(5000, 60.0, id="huge-count-capped-without-overflow"),
    ],
)
def test_cooldown_grows_exponentially_up_to_max(strikes: int, expected: float) -> None:
    assert POLICY.cooldown_s(strikes) == expected


def test_blacklist_removes_host_at_once_and_returns_cooldown_end() -> None:
    manager, _, clock = make({"a": 1, "b": 2})
    manager.discover()
    assert manager.exclude_until("a") == clock.now + 10.0
    assert manager.current_hosts == (("b", 2),)
    assert "a" in manager.blacklist
    assert "b" not in manager.blacklist
    assert dict(manager.blacklist.active()) == {"a": clock.now + 10.0}
    # The blacklisted host is not reported as removed: it was already out of the view.
    assert manager.discover() == HostUpdate()


def test_repeated_blacklisting_doubles_cooldown_up_to_max() -> None:
    manager, _, clock = make({"a": 1})
    durations = []
    for _ in range(5):
        manager.discover()
        start = clock.now
        durations.append(manager.exclude_until("a") - start)
        clock.advance(durations[-1])
    assert durations == [10.0, 20.0, 40.0, 60.0, 60.0]


def test_host_is_usable_again_after_cooldown_and_goes_last() -> None:
    manager, _, clock = make({"a": 1, "b": 1, "c": 1})
    manager.discover()
    manager.exclude("a")
    clock.advance(9.9)
    assert manager.discover() == HostUpdate()
    assert "a" in manager.blacklist
    clock.advance(0.1)
    assert "a" not in manager.blacklist
    assert dict(manager.blacklist.active()) == {}
    # Not usable until the next discovery, then placed last.
    assert names(manager) == ["b", "c"]
    assert manager.discover() == HostUpdate(added=("a",))
    assert names(manager) == ["b", "c", "a"]


def test_blacklisting_is_never_permanent() -> None:
    manager, _, clock = make({"a": 1})
    for _ in range(50):
        manager.discover()
        clock.advance(manager.exclude_until("a") - clock.now)
    assert manager.discover() == HostUpdate(added=("a",))
    assert names(manager) == ["a"]


def test_expired_host_no_longer_discovered_stays_out() -> None:
    manager, discovery, clock = make({"a": 1, "b": 1})
    manager.discover()
    manager.exclude("a")
    discovery.hosts = {"b": 1}
    clock.advance(10.0)
    assert manager.discover() == HostUpdate()
    assert names(manager) == ["b"]


def test_all_discovered_blacklisted() -> None:
    manager, discovery, clock = make({})
    manager.discover()
    assert not manager.all_discovered_blacklisted(), "no host discovered"
    discovery.hosts = {"a": 1, "b": 1}
    manager.discover()
    manager.exclude("a")
    assert not manager.all_discovered_blacklisted()
    manager.exclude("b")
    assert manager.all_discovered_blacklisted()
    assert manager.current_hosts == ()
    clock.advance(10.0)
    assert not manager.all_discovered_blacklisted()


def test_blacklisting_an_undiscovered_host_keeps_it_out_when_it_appears() -> None:
    manager, discovery, clock = make({"a": 1})
    manager.discover()
    manager.exclude("z")
    discovery.hosts = {"a": 1, "z": 1}
    assert manager.discover() == HostUpdate()
    clock.advance(10.0)
    assert manager.discover() == HostUpdate(added=("z",))


HOSTS = [f"h{i}" for i in range(6)]


@given(
    steps=st.lists(
        st.tuples(
            st.lists(st.sampled_from(HOSTS), unique=True),
            st.sets(st.sampled_from(HOSTS), max_size=2),
            st.floats(min_value=0.0, max_value=100.0),
        ),
        max_size=25,
    )
)
def test_order_keeps_survivors_and_puts_new_hosts_last(
    steps: list[tuple[list[str], set[str], float]],
) -> None:
    manager, discovery, clock = make({})
    previous: list[str] = []
    for discovered, to_blacklist, elapsed in steps:
        clock.advance(elapsed)
        discovery.hosts = dict.fromkeys(discovered, 1)
        update = manager.discover()
        current = names(manager)
        survivors = [h for h in previous if h in current]
        new = [h for h in current if h not in previous]
        assert current == survivors + new
        assert list(update.added) == new
        assert set(update.removed) == set(previous) - set(current)
        assert all(h in discovered and h not in manager.blacklist for h in current)
        assert {h for h in discovered if h not in manager.blacklist} == set(current)
        for host in sorted(to_blacklist):
            manager.exclude(host)
        previous = names(manager)
        assert not set(previous) & to_blacklist
