"""Who probes whom in a round, and the probe reports a job accepts, drops or refuses."""

from __future__ import annotations

import pytest

from elasticjob.driver.slot_assignment import assign_slots
from elasticjob.rendezvous.jobs import InMemoryJobRendezvous
from elasticjob.rendezvous.probes import probe_targets, probers_of
from elasticjob.rendezvous.rendezvous_types import ProbeReport, Refusal, RequestRefused
from elasticjob.wire.messages import (
    HeartbeatRequest,
    PeerEndpoint,
    ProbedPeer,
    RendezvousRequest,
    RendezvousStatus,
    SlotInfo,
    WorkerId,
)
from elasticjob.wire.protocol import MAX_PROBE_TARGETS
from tests.support.rendezvous_jobs import RecordingListener


def W(host: str, slot: int = 0) -> WorkerId:
    return WorkerId(host, slot)


def slots(*hosts: tuple[str, int]) -> dict[WorkerId, SlotInfo]:
    return assign_slots(list(hosts), min_np=1, max_np=None)


@pytest.mark.parametrize(
    ("hosts", "expected"),
    [
        ([("a", 1)], {W("a"): ()}),
        ([("a", 1), ("b", 1)], {W("a"): (W("b"),), W("b"): (W("a"),)}),
        (
            [("a", 1), ("b", 1), ("c", 1)],
            {W("a"): (W("c"), W("b")), W("b"): (W("a"), W("c")), W("c"): (W("a"), W("b"))},
        ),
        (
            [("a", 1), ("b", 1), ("c", 1), ("d", 1), ("e", 1)],
            {
                W("a"): (W("e"), W("b")),
                W("b"): (W("a"), W("c")),
                W("c"): (W("a"), W("b"), W("d")),
                W("d"): (W("a"), W("c"), W("e")),
                W("e"): (W("a"), W("d")),
            },
        ),
        # Two slots per host: rings per local rank; host-mates (rank 0's included) left out.
        (
            [("a", 2), ("b", 2), ("c", 2)],
            {
                W("a", 0): (W("c", 0), W("b", 0)),
                W("a", 1): (W("c", 1), W("b", 1)),
                W("b", 0): (W("a", 0), W("c", 0)),
                W("b", 1): (W("a", 0), W("a", 1), W("c", 1)),
                W("c", 0): (W("a", 0), W("b", 0)),
                W("c", 1): (W("a", 0), W("b", 1), W("a", 1)),
            },
        ),
        # One host: nobody to probe (host-mates share its network).
        ([("a", 3)], {W("a", 0): (), W("a", 1): (), W("a", 2): ()}),
        # Uneven hosts: local rank 1 exists on a and c only.
        (
            [("a", 2), ("b", 1), ("c", 2)],
            {
                W("a", 0): (W("c", 0), W("b", 0)),
                W("a", 1): (W("c", 1),),
                W("b", 0): (W("a", 0), W("c", 0)),
                W("c", 0): (W("a", 0), W("b", 0)),
                W("c", 1): (W("a", 0), W("a", 1)),
            },
        ),
    ],
    ids=["one", "two", "three", "five", "two-slots", "one-host", "uneven"],
)
def test_probe_targets(
    hosts: list[tuple[str, int]], expected: dict[WorkerId, tuple[WorkerId, ...]]
) -> None:
    assert probe_targets(slots(*hosts)) == expected


def test_probes_stay_o1_per_worker_at_1024_ranks() -> None:
    round_slots = slots(*[(f"h{i}", 4) for i in range(256)])
    targets = probe_targets(round_slots)
    probers = probers_of(targets)
    rank0 = W("h0", 0)
    assert max(len(peers) for peers in targets.values()) <= MAX_PROBE_TARGETS
    assert all(peer.hostname != worker.hostname for worker, p in targets.items() for peer in p)
    assert probers[rank0] == {w for w in round_slots if w.hostname != "h0"}
    assert all(len(probers[w]) == 2 for w in round_slots if w != rank0)


# ---- what a job does with reports ------------------------------------------------------

A, B, C = W("a"), W("b"), W("c")


def register(worker: WorkerId) -> RendezvousRequest:
    return RendezvousRequest(
        hostname=worker.hostname,
        local_rank=worker.local_rank,
        address=f"10.0.0.{ord(worker.hostname[0]) - 96}",
        store_port=29500 + worker.local_rank,
        wait_seconds=0,
    )


def beat(worker: WorkerId, round_number: int | None, *unreachable: WorkerId) -> HeartbeatRequest:
    return HeartbeatRequest(
        hostname=worker.hostname,
        local_rank=worker.local_rank,
        round=round_number,
        unreachable=tuple(
            ProbedPeer(hostname=w.hostname, local_rank=w.local_rank) for w in unreachable
        ),
    )


@pytest.fixture
def listener() -> RecordingListener:
    return RecordingListener()


@pytest.fixture
async def job(listener: RecordingListener) -> InMemoryJobRendezvous:
    """Round 1 of a, b, c (ranks in that order), every member registered."""
    job = InMemoryJobRendezvous("job-a", "secret-a", listener)
    job.readmit([A, B, C])
    for worker in (A, B, C):
        await job.rendezvous(register(worker))
    job.publish_round(1, slots(("a", 1), ("b", 1), ("c", 1)), sync=True)
    return job


async def test_the_round_hands_each_member_its_targets_endpoints(
    job: InMemoryJobRendezvous,
) -> None:
    answer = await job.rendezvous(register(B))
    assert answer.status is RendezvousStatus.ASSIGNED
    assert answer.peers == (
        PeerEndpoint(hostname="a", local_rank=0, address="10.0.0.1", store_port=29500),
        PeerEndpoint(hostname="c", local_rank=0, address="10.0.0.3", store_port=29500),
    )


async def test_a_report_of_the_current_round_reaches_the_driver(
    job: InMemoryJobRendezvous, listener: RecordingListener
) -> None:
    job.report_heartbeat(beat(B, 1, C))
    job.report_heartbeat(beat(A, 1))
    job.report_heartbeat(beat(C, None))
    assert listener.reports == [
        (B, ProbeReport(1, frozenset({C}))),
        (A, ProbeReport(1, frozenset())),
        (C, None),
    ]


async def test_a_report_of_an_older_round_is_dropped_but_the_beat_counts(
    job: InMemoryJobRendezvous, listener: RecordingListener
) -> None:
    for worker in (A, B):
        await job.rendezvous(register(worker).model_copy(update={"after_round": 1}))
    job.publish_round(2, slots(("a", 1), ("b", 1)), sync=True)
    job.report_heartbeat(beat(B, 1, C))
    assert listener.reports == [(B, None)]


@pytest.mark.parametrize(
    ("request_", "refusal"),
    [
        (beat(B, 2, C), Refusal.FUTURE_ROUND),
        (beat(A, 1, W("a", 1)), Refusal.INVALID_REPORT),  # not a member
        (beat(B, 1, B), Refusal.INVALID_REPORT),  # itself
        (beat(W("x"), 1, C), Refusal.UNKNOWN_WORKER),
    ],
    ids=["future-round", "non-member", "itself", "stranger-reporter"],
)
async def test_invalid_reports_are_refused_and_change_nothing(
    job: InMemoryJobRendezvous,
    listener: RecordingListener,
    request_: HeartbeatRequest,
    refusal: Refusal,
) -> None:
    with pytest.raises(RequestRefused) as caught:
        job.report_heartbeat(request_)
    assert caught.value.refusal is refusal
    assert listener.heartbeats == [] and listener.reports == []


async def test_a_report_may_name_only_the_reporters_targets() -> None:
    listener = RecordingListener()
    job = InMemoryJobRendezvous("job-a", "secret-a", listener)
    members = [W(h) for h in "abcde"]
    job.readmit(members)
    for worker in members:
        await job.rendezvous(register(worker))
    job.publish_round(1, slots(*[(h, 1) for h in "abcde"]), sync=True)
    job.report_heartbeat(beat(W("c"), 1, W("a"), W("b"), W("d")))
    with pytest.raises(RequestRefused) as caught:
        job.report_heartbeat(beat(W("c"), 1, W("e")))  # e is not c's neighbour
    assert caught.value.refusal is Refusal.INVALID_REPORT
    assert listener.reports == [(W("c"), ProbeReport(1, frozenset(map(W, "abd"))))]
