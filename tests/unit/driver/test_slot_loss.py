"""The plan for a failed process of a host that lives on: drop the host, or restart the slot
in place, whichever moves less of the sharded state; one row per branch."""

from __future__ import annotations

from fractions import Fraction

import pytest

from elasticjob.driver.slot_loss import (
    MAX_SLOT_RESTARTS,
    SlotLossAction,
    decide_slot_loss,
)
from elasticjob.wire.messages import HeldShards, WorkerId

A0, A1, B0, B1, C0, C1 = (WorkerId(h, s) for h in ("a", "b", "c") for s in (0, 1))
TWO_PODS = [A0, A1, B0, B1]

DROP, RESTART = SlotLossAction.DROP_HOST, SlotLossAction.RESTART_SLOT


def hsdp(own: int, *copies: int, shards: int = 2) -> HeldShards:
    return HeldShards(shards=shards, own=own, copies=copies, hsdp=True)


def flat(own: int, *copies: int, shards: int = 4) -> HeldShards:
    return HeldShards(shards=shards, own=own, copies=copies)


# One copy each, as ``shard_plan.copy_holders`` places them for two hosts of two ranks.
FLAT_TWO_PODS = {A0: flat(0, 2), A1: flat(1, 3), B0: flat(2, 0), B1: flat(3, 1)}
HSDP_TWO_PODS = {A0: hsdp(0), A1: hsdp(1), B0: hsdp(0), B1: hsdp(1)}


@pytest.mark.parametrize(
    ("lost", "members", "dead", "held", "restarts", "action", "drop", "restart", "why"),
    [
        pytest.param(
            C0,
            TWO_PODS,
            (),
            FLAT_TWO_PODS,
            0,
            DROP,
            None,
            None,
            "not a member",
            id="not-a-member",
        ),
        pytest.param(
            A1,
            [A1, A0, B0, B1],
            (),
            FLAT_TWO_PODS,
            0,
            DROP,
            None,
            None,
            "rank 0",
            id="rank-0-is-taken-from-a-survivor",
        ),
        pytest.param(
            B0,
            [A0, B0],
            (),
            {A0: flat(0, 1, shards=2), B0: flat(1, 0, shards=2)},
            0,
            DROP,
            None,
            None,
            "no other process of its host",
            id="a-host-of-one-slot-is-lost",
        ),
        pytest.param(
            B1,
            TWO_PODS,
            (B0,),
            FLAT_TWO_PODS,
            0,
            DROP,
            None,
            None,
            "no other process of its host",
            id="its-sibling-died-too-the-host-is-lost",
        ),
        pytest.param(
            B1,
            TWO_PODS,
            (),
            FLAT_TWO_PODS,
            MAX_SLOT_RESTARTS,
            DROP,
            None,
            None,
            "restarted 3 times",
            id="a-host-that-keeps-failing-is-dropped",
        ),
        pytest.param(
            B1,
            TWO_PODS,
            (),
            {},
            0,
            DROP,
            None,
            None,
            "no sharded state",
            id="a-replicated-state-moves-nothing-without-the-host",
        ),
        pytest.param(
            B1,
            TWO_PODS,
            (),
            HSDP_TWO_PODS,
            0,
            DROP,
            Fraction(0),
            Fraction(1, 2),
            "move 0 of a replica",
            id="hsdp-another-replica-holds-every-shard",
        ),
        pytest.param(
            B1,
            [A0, A1, B0, B1, C0, C1],
            (),
            {**HSDP_TWO_PODS, C0: hsdp(0), C1: hsdp(1)},
            0,
            DROP,
            Fraction(0),
            Fraction(1, 2),
            "move 0 of a replica",
            id="hsdp-three-replicas-the-middle-one",
        ),
        pytest.param(
            A1,
            [A0, A1],
            (),
            {A0: hsdp(0, 1), A1: hsdp(1, 0)},
            0,
            RESTART,
            None,
            Fraction(1, 2),
            "dropping its host cannot keep every shard",
            id="hsdp-one-replica-its-copy-on-the-sibling",
        ),
        pytest.param(
            A1,
            [A0, A1],
            (),
            {A0: hsdp(0), A1: hsdp(1)},
            0,
            DROP,
            None,
            None,
            "no other rank holds its shard",
            id="hsdp-one-replica-without-copies",
        ),
        pytest.param(
            B1,
            TWO_PODS,
            (),
            FLAT_TWO_PODS,
            0,
            RESTART,
            Fraction(1, 2),
            Fraction(1, 4),
            "restart moves 1/4 of a replica; dropping its host moves 1/2",
            id="flat-two-pods-a-reshard-moves-twice-the-lost-shard",
        ),
        pytest.param(
            B1,
            [A0, B0, B1],
            (),
            {A0: flat(0, 1, 2, shards=3), B0: flat(1, shards=3), B1: flat(2, shards=3)},
            0,
            DROP,
            Fraction(0),
            Fraction(1, 3),
            "move 0 of a replica",
            id="flat-copies-cover-the-world-without-the-host",
        ),
        pytest.param(
            B1,
            TWO_PODS,
            (),
            {**FLAT_TWO_PODS, A0: flat(0, 2, shards=5)},
            0,
            RESTART,
            None,
            Fraction(1, 4),
            "cannot keep every shard",
            id="flat-reports-that-disagree",
        ),
        pytest.param(
            B1,
            TWO_PODS,
            (),
            {A0: flat(0), A1: flat(1), B0: flat(2, 3), B1: flat(3, 2)},
            0,
            RESTART,
            None,
            Fraction(1, 4),
            "cannot keep every shard",
            id="flat-its-copy-only-on-its-sibling",
        ),
    ],
)
def test_slot_loss(
    lost: WorkerId,
    members: list[WorkerId],
    dead: tuple[WorkerId, ...],
    held: dict[WorkerId, HeldShards],
    restarts: int,
    action: SlotLossAction,
    drop: Fraction | None,
    restart: Fraction | None,
    why: str,
) -> None:
    alive = {m for m in members if m != lost and m not in dead}
    loss = decide_slot_loss(lost, members, alive, held, host_restarts=restarts)
    assert (loss.action, loss.drop_moves, loss.restart_moves) == (action, drop, restart)
    assert why in loss.reason
    assert loss.restarts is (action is RESTART)


def test_the_plan_depends_on_what_it_is_given_only() -> None:
    """The same facts give the same plan: the driver asks it once for the supervisor's answer
    and once where it carries the failure out."""
    alive = {A0, A1, B0}
    first = decide_slot_loss(B1, TWO_PODS, alive, FLAT_TWO_PODS, host_restarts=0)
    assert decide_slot_loss(B1, TWO_PODS, alive, FLAT_TWO_PODS, host_restarts=0) == first
