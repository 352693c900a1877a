"""The partition decision, one row per branch: who is evicted from which reports."""

from __future__ import annotations

import pytest

from elasticjob.driver.partition import Partitioned, ReceivedReport, partitioned_members
from elasticjob.driver.slot_assignment import assign_slots
from elasticjob.wire.messages import SlotInfo, WorkerId

NOW = 1000.0
MAX_AGE_S = 5.0
ROUND = 3


def W(host: str, slot: int = 0) -> WorkerId:
    return WorkerId(host, slot)


def ring(n: int) -> dict[WorkerId, SlotInfo]:
    """``n`` one-slot hosts h0..h{n-1}, ranks in that order."""
    return assign_slots([(f"h{i}", 1) for i in range(n)], min_np=1, max_np=None)


def H(i: int) -> WorkerId:
    return W(f"h{i}")


def report(*unreachable: WorkerId, round_number: int = ROUND, age: float = 0.5) -> ReceivedReport:
    return ReceivedReport(round_number, frozenset(unreachable), NOW - age)


def decide(
    slots: dict[WorkerId, SlotInfo], reports: dict[WorkerId, ReceivedReport]
) -> list[Partitioned]:
    return partitioned_members(reports, slots, round_number=ROUND, now=NOW, max_age_s=MAX_AGE_S)


# Five one-slot hosts: h_i probes h0 and its ring neighbours h_{i-1}, h_{i+1}.
ISOLATED_H2 = {
    H(1): report(H(2)),
    H(3): report(H(2)),
    H(2): report(H(0), H(1), H(3)),
    H(0): report(),
    H(4): report(),
}


@pytest.mark.parametrize(
    ("slots", "reports", "expected"),
    [
        pytest.param(ring(5), {}, [], id="no-reports"),
        pytest.param(ring(5), ISOLATED_H2, [Partitioned(H(2), (H(1), H(3)))], id="isolated-rank"),
        pytest.param(
            ring(5),
            {H(1): report(H(2)), H(2): report(H(0), H(1), H(3))},
            [],
            id="one-of-two-probers-so-far",
        ),
        pytest.param(
            ring(5),
            {H(2): report(H(0), H(1), H(3)), H(3): report(H(2)), H(4): report()},
            [],
            # h3's other prober (h4) reached it: the cut-off h2's vote alone condemns nobody.
            id="cut-off-reporter-alone",
        ),
        pytest.param(
            ring(5),
            {
                H(0): report(H(1), H(4)),
                H(1): report(H(0)),
                H(2): report(H(0)),
                H(3): report(H(0)),
                H(4): report(H(0)),
            },
            [Partitioned(H(0), (H(1), H(2), H(3), H(4)))],
            id="isolated-rank-0",
        ),
        pytest.param(
            ring(5),
            {H(0): report(H(1), H(4)), H(1): report(H(0)), H(4): report(H(0))},
            [],
            id="rank-0-needs-a-majority-of-all",
        ),
        pytest.param(
            ring(2),
            {H(0): report(H(1)), H(1): report(H(0))},
            [Partitioned(H(1), (H(0),))],
            id="two-members-accuse-each-other-rank-0-stays",
        ),
        pytest.param(
            ring(5),
            {H(1): report(H(2), round_number=ROUND - 1), H(3): report(H(2))},
            [],
            id="stale-round-ignored",
        ),
        pytest.param(
            ring(5),
            {H(1): report(H(2), age=MAX_AGE_S + 0.1), H(3): report(H(2))},
            [],
            id="old-report-ignored",
        ),
        pytest.param(
            ring(5),
            {W("gone"): report(H(2)), H(3): report(H(2))},
            [],
            id="non-member-ignored",
        ),
        pytest.param(
            ring(7),
            {
                H(1): report(H(2)),
                H(2): report(H(0), H(1), H(3)),
                H(3): report(H(2), H(4)),
                H(4): report(H(0), H(3), H(5)),
                H(5): report(H(4)),
            },
            [Partitioned(H(4), (H(3), H(5))), Partitioned(H(2), (H(1), H(3)))],
            # h3 sits between two cut-off members: their votes are one of its two probers.
            id="reporter-reported-is-ignored",
        ),
        pytest.param(
            assign_slots([("a", 2), ("b", 2), ("c", 2)], min_np=1, max_np=None),
            {
                W("a", 0): report(W("c", 0)),
                W("a", 1): report(W("c", 1)),
                W("b", 0): report(W("c", 0)),
                W("b", 1): report(W("c", 1)),
                W("c", 0): report(W("a", 0), W("b", 0)),
                W("c", 1): report(W("a", 0), W("b", 1), W("a", 1)),
            },
            [
                Partitioned(W("c", 1), (W("a", 1), W("b", 1))),
                Partitioned(W("c", 0), (W("a", 0), W("b", 0))),
            ],
            id="isolated-host-of-two-slots",
        ),
    ],
)
def test_partitioned_members(
    slots: dict[WorkerId, SlotInfo],
    reports: dict[WorkerId, ReceivedReport],
    expected: list[Partitioned],
) -> None:
    assert decide(slots, reports) == expected


def test_empty_reports_evict_nobody() -> None:
    """A slow step: everyone probes, everyone answers."""
    assert decide(ring(4), {H(i): report() for i in range(4)}) == []
