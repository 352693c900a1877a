"""Leader election: every branch of the decision (a table), and two replicas' electors taking
turns on one in-memory Lease that refuses a write at a stale version, as the API server does."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from elasticjob.operator.leader_election import (
    Candidate,
    ElectionSettings,
    Move,
    SeenLease,
    decide,
)
from elasticjob.operator.leader_lease import LeaderElector, LeaseRef, new_identity, pod_of

SETTINGS = ElectionSettings(lease_duration_s=3, renew_deadline_s=2.0, retry_period_s=0.5)
NOW = 100.0


def seen(holder: str, observed_at: float = NOW, duration_s: int = 3) -> SeenLease:
    return SeenLease(holder=holder, duration_s=duration_s, observed_at=observed_at)


def me(
    *, eligible: bool = True, leading: bool = False, renewed_at: float | None = None
) -> Candidate:
    return Candidate("me", eligible, leading, renewed_at)


@pytest.mark.parametrize(
    ("lease", "candidate", "read_failed", "move"),
    [
        # a candidate
        (None, me(), False, Move.ACQUIRE),
        (seen(""), me(), False, Move.ACQUIRE),
        (seen("me"), me(), False, Move.ACQUIRE),
        (seen("other"), me(), False, Move.WAIT),
        (seen("other", observed_at=NOW - 2.9), me(), False, Move.WAIT),
        (seen("other", observed_at=NOW - 3.0), me(), False, Move.ACQUIRE),
        (seen("other", observed_at=NOW - 1.5, duration_s=1), me(), False, Move.ACQUIRE),
        (None, me(eligible=False), False, Move.WAIT),
        (seen("other", observed_at=NOW - 10), me(eligible=False), False, Move.WAIT),
        (None, me(), True, Move.WAIT),
        # the leader
        (seen("me"), me(leading=True, renewed_at=NOW - 0.5), False, Move.RENEW),
        (seen(""), me(leading=True, renewed_at=NOW - 0.5), False, Move.ACQUIRE),
        (None, me(leading=True, renewed_at=NOW - 0.5), False, Move.ACQUIRE),
        (seen("other"), me(leading=True, renewed_at=NOW - 0.5), False, Move.LOST),
        (seen("me"), me(leading=True, renewed_at=NOW - 2.0), False, Move.LOST),
        (seen("me"), me(leading=True, renewed_at=None), False, Move.LOST),
        (None, me(leading=True, renewed_at=NOW - 1.9), True, Move.WAIT),
        (None, me(leading=True, renewed_at=NOW - 2.0), True, Move.LOST),
        (seen("me"), me(eligible=False, leading=True, renewed_at=NOW - 0.5), False, Move.STEP_DOWN),
        (None, me(eligible=False, leading=True, renewed_at=NOW - 0.5), True, Move.STEP_DOWN),
        (seen("me"), me(eligible=False, leading=True, renewed_at=NOW - 5), False, Move.LOST),
    ],
    ids=[
        "no-lease",
        "released",
        "its-own-from-an-earlier-life",
        "held",
        "held-until-the-duration-runs-out",
        "expired",
        "expired-by-its-own-duration",
        "not-eligible",
        "not-eligible-though-expired",
        "unread",
        "leader-renews",
        "leader-finds-it-emptied",
        "leader-finds-it-gone",
        "leader-finds-another-holder",
        "leader-past-its-renew-deadline",
        "leader-never-renewed",
        "leader-unread-within-the-deadline",
        "leader-unread-past-the-deadline",
        "leader-not-eligible",
        "leader-not-eligible-unread",
        "leader-not-eligible-past-the-deadline",
    ],
)
def test_decide(
    lease: SeenLease | None, candidate: Candidate, read_failed: bool, move: Move
) -> None:
    assert decide(lease, candidate, NOW, SETTINGS, read_failed=read_failed) is move


@pytest.mark.parametrize(
    ("duration", "deadline", "retry"),
    [(2, 2.0, 0.5), (3, 1.0, 1.0), (3, 2.0, 0.0)],
    ids=["deadline-not-below-duration", "retry-not-below-deadline", "no-retry-period"],
)
def test_settings_that_cannot_work_are_refused(
    duration: int, deadline: float, retry: float
) -> None:
    with pytest.raises(ValueError, match="lease duration > renew deadline > retry period"):
        ElectionSettings(duration, deadline, retry)


def test_an_identity_names_its_pod_and_differs_per_process() -> None:
    first, second = new_identity("op-7d9f-abcde"), new_identity("op-7d9f-abcde")
    assert first != second
    assert pod_of(first) == pod_of(second) == "op-7d9f-abcde"


# --- electors on one Lease ------------------------------------------------------------------


class LeaseStore:
    """One Lease, as the API server keeps it: a write at a version other than the current one
    (or a create of one that exists) is refused with 409; ``down`` refuses every call."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0
        self.down: set[str] = set()
        """Identities of the candidates that cannot reach it."""
        self.events: list[str] = []

    def api(self, identity: str) -> LeaseApi:
        return LeaseApi(self, identity)


class LeaseApi:
    def __init__(self, store: LeaseStore, identity: str) -> None:
        self.store, self.identity = store, identity

    def _reach(self) -> None:
        if self.identity in self.store.down:
            raise OSError("connection refused")

    async def read_lease(
        self, namespace: str, name: str, timeout_s: float
    ) -> dict[str, Any] | None:
        self._reach()
        found = copy.deepcopy(self.store.lease)
        await asyncio.sleep(0)  # another replica may read the same version meanwhile
        return found

    async def write_lease(
        self, namespace: str, lease: dict[str, Any], timeout_s: float
    ) -> dict[str, Any]:
        self._reach()
        store = self.store
        version = lease["metadata"].get("resourceVersion")
        if (store.lease is None) != (version is None) or (
            version is not None and version != str(store.version)
        ):
            raise ApiException(status=409, reason="Conflict")
        store.version += 1
        store.lease = copy.deepcopy(lease)
        store.lease["metadata"].update(resourceVersion=str(store.version), uid="lease-uid")
        return copy.deepcopy(store.lease)

    async def lease_event(self, lease: dict[str, Any], reason: str, message: str) -> None:
        self.store.events.append(message)


class Replica:
    """What the elector tells the operator, recorded."""

    def __init__(self, store: LeaseStore, identity: str, clock: list[float]) -> None:
        self.eligible = True
        self.told: list[str] = []
        self.elector = LeaderElector(
            store.api(identity),  # type: ignore[arg-type]
            LeaseRef("system", "op-leader"),
            identity,
            SETTINGS,
            self,
            lambda: self.eligible,
            clock=lambda: clock[0],
        )

    async def lead(self) -> None:
        self.told.append("lead")

    async def stand_down(self, *, lost: bool) -> None:
        self.told.append("lost" if lost else "stood down")


@pytest.fixture
def clock() -> list[float]:
    return [NOW]


async def test_one_replica_leads_and_the_other_takes_over_once_its_lease_runs_out(
    clock: list[float],
) -> None:
    store = LeaseStore()
    a, b = Replica(store, "a_1", clock), Replica(store, "b_1", clock)
    assert await a.elector.step() is Move.ACQUIRE
    assert await b.elector.step() is Move.WAIT
    assert a.told == ["lead"] and b.told == []
    for _ in range(10):  # a renews every retry period; b keeps waiting
        clock[0] += SETTINGS.retry_period_s
        assert await a.elector.step() is Move.RENEW
        assert await b.elector.step() is Move.WAIT
    # a is killed: no more renewals. b takes the Lease a lease duration after it last saw it
    # change, on its own clock.
    clock[0] += SETTINGS.lease_duration_s - 0.1
    assert await b.elector.step() is Move.WAIT
    clock[0] += 0.1
    assert await b.elector.step() is Move.ACQUIRE
    assert b.told == ["lead"] and b.elector.leading
    assert store.lease is not None and store.lease["spec"]["leaseTransitions"] == 1
    await asyncio.sleep(0)
    assert store.events == ["a_1 leads (after nobody)", "b_1 leads (after a_1)"]


async def test_a_replica_that_may_not_lead_steps_down_and_releases_for_the_next_read(
    clock: list[float],
) -> None:
    store = LeaseStore()
    a, b = Replica(store, "a_1", clock), Replica(store, "b_1", clock)
    await a.elector.step()
    await b.elector.step()
    a.eligible = False  # its pod turned not ready
    assert await a.elector.step() is Move.STEP_DOWN
    assert a.told == ["lead", "stood down"] and not a.elector.leading
    assert store.lease is not None and store.lease["spec"]["holderIdentity"] == ""
    assert await b.elector.step() is Move.ACQUIRE, "no wait for the lease to run out"
    assert await a.elector.step() is Move.WAIT


async def test_a_leader_that_cannot_renew_stops_before_a_standby_may_take_over(
    clock: list[float],
) -> None:
    store = LeaseStore()
    a, b = Replica(store, "a_1", clock), Replica(store, "b_1", clock)
    await a.elector.step()
    await b.elector.step()
    store.down.add("a_1")
    moves = []
    while not b.elector.leading:
        clock[0] += SETTINGS.retry_period_s
        moves.append((clock[0] - NOW, await a.elector.step(), await b.elector.step()))
    lost_at = next(at for at, move, _ in moves if move is Move.LOST)
    took_at = next(at for at, _, move in moves if move is Move.ACQUIRE)
    assert lost_at == SETTINGS.renew_deadline_s and took_at == SETTINGS.lease_duration_s
    assert a.told == ["lead", "lost"]


async def test_of_two_candidates_writing_the_same_version_one_leads(clock: list[float]) -> None:
    store = LeaseStore()
    a, b = Replica(store, "a_1", clock), Replica(store, "b_1", clock)
    await asyncio.gather(a.elector.step(), b.elector.step())
    assert [a.elector.leading, b.elector.leading].count(True) == 1


async def test_release_at_stop_hands_over_at_once(clock: list[float]) -> None:
    store = LeaseStore()
    a, b = Replica(store, "a_1", clock), Replica(store, "b_1", clock)
    await a.elector.step()
    await b.elector.step()
    await a.elector.release()
    assert a.told[-1] == "stood down"
    assert await b.elector.step() is Move.ACQUIRE


async def test_the_election_goes_on_after_a_step_fails_and_ends_when_closed(
    clock: list[float],
) -> None:
    store = LeaseStore()
    a = Replica(store, "a_1", clock)
    api = a.elector._api  # the replica's LeaseApi
    real_read = api.read_lease
    failures = [RuntimeError("an unexpected failure")]

    async def read_once_failing(namespace: str, name: str, timeout_s: float) -> Any:
        if failures:
            raise failures.pop()
        return await real_read(namespace, name, timeout_s)

    api.read_lease = read_once_failing  # type: ignore[method-assign]
    running = asyncio.create_task(a.elector.run())
    await asyncio.wait_for(_until(lambda: a.elector.leading), 5.0)
    a.elector.close()
    await asyncio.wait_for(running, 5.0)
    assert a.told == ["lead"]


async def _until(check: Any) -> None:
    while not check():
        await asyncio.sleep(0.01)
