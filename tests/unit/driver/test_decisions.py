"""Table tests of the driver's decisions (``elasticjob.driver.decisions`` and
``elasticjob.driver.planning``)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from elasticjob.driver.decisions import (
    Action,
    ReadyVerdict,
    classify_ready,
    decide_discovery_failure,
    decide_round,
    leaving_members,
)
from elasticjob.driver.driver_types import Departure, DriverPhase, DriverSettings
from elasticjob.driver.host_manager import Capacity
from elasticjob.driver.planning import (
    AwaitBarrier,
    AwaitCapacity,
    CapacityAction,
    EndJob,
    FormRound,
    NextRound,
    Publish,
    ScaleOutAction,
    decide_capacity,
    decide_formation,
    decide_scale_out,
    plan_round,
)
from elasticjob.driver.registry import RoundRecords
from elasticjob.driver.slot_assignment import assign_slots
from elasticjob.driver.worker_record import WorkerRecord
from elasticjob.wire.messages import HeldShards, ScriptExit, SlotInfo, WorkerId, WorkerState

R, S, F = WorkerState.READY, WorkerState.SUCCESS, WorkerState.FAILURE
A0, A1, B0, C0 = WorkerId("a", 0), WorkerId("a", 1), WorkerId("b", 0), WorkerId("c", 0)


def records(
    states: dict[WorkerId, WorkerState],
    members: tuple[WorkerId, ...] = (A0, A1, B0),
    leaving: tuple[WorkerId, ...] = (),
    rolled_back: tuple[WorkerId, ...] = (),
    script_exits: dict[WorkerId, ScriptExit] | None = None,
) -> RoundRecords:
    return RoundRecords(
        frozenset(members), states, frozenset(leaving), frozenset(rolled_back), script_exits or {}
    )


@dataclass(frozen=True)
class Case:
    """One row of the decide_round table: members are a[0], a[1] and b[0]."""

    name: str
    states: dict[WorkerId, WorkerState]
    action: Action
    reason_parts: tuple[str, ...] = ()
    failed_hosts: frozenset[str] = frozenset()
    leaving: tuple[WorkerId, ...] = ()
    rolled_back: tuple[WorkerId, ...] = ()
    resets: int = 0
    limit: int | None = None
    fallback: bool = False
    """A checkpoint policy is configured (``checkpoint_fallback``)."""
    script_exits: tuple[tuple[WorkerId, int], ...] = ()
    """Members whose script failed on its own, with its return code, in the order they said
    so (elastic mode: it raised and the process failed; restart mode: its agent asks for the
    next round)."""
    restarts: int = 0
    restart_limit: int | None = None
    stalled: int = 0
    """Rounds in a row that failed before with no new commit (``failed_rounds_without_commit``)."""
    stall_limit: int | None = None
    """``max_failed_rounds_without_commit``."""


AB = frozenset({"a", "b"})

DECIDE_CASES = [
    Case("wait-for-missing", {A0: R, A1: R}, Action.WAIT, ("1 of 3", "b[0]")),
    Case("wait-even-after-a-success", {A0: S, A1: F}, Action.WAIT, ("b[0]",)),
    Case("one-success-succeeds", {A0: S, A1: R, B0: F}, Action.SUCCEED, ("1 of 3", "a[0]")),
    Case("all-succeed-ignores-limit", {A0: S, A1: S, B0: S}, Action.SUCCEED, resets=9, limit=1),
    Case("all-failed", {A0: F, A1: F, B0: F}, Action.FAIL, ("all 3 workers failed", "b[0]")),
    Case(
        "one-failure-resumes",
        {A0: F, A1: R, B0: R},
        Action.RESUME,
        ("reset 1", "a[0]", "blacklisting hosts a"),
        failed_hosts=frozenset({"a"}),
    ),
    Case(
        "failures-within-limit",
        {A0: F, A1: R, B0: F},
        Action.RESUME,
        ("reset 3", "b[0]"),
        failed_hosts=AB,
        resets=2,
        limit=3,
    ),
    Case("all-ready-resumes", {A0: R, A1: R, B0: R}, Action.RESUME, ("no worker failed",)),
    Case(
        "reset-limit-exceeded",
        {A0: F, A1: R, B0: R},
        Action.FAIL,
        ("reset limit 3 exceeded", "a[0]"),
        resets=3,
        limit=3,
    ),
    Case("zero-reset-limit", {A0: R, A1: R, B0: R}, Action.FAIL, ("reset limit 0",), limit=0),
    Case("leaving-not-awaited", {A0: R, A1: R}, Action.RESUME, ("reset 1",), leaving=(B0,)),
    Case(
        "leaving-failure-ignored",
        {A0: R, A1: R, B0: F},
        Action.RESUME,
        ("no worker failed",),
        leaving=(B0,),
    ),
    Case(
        "all-counted-failed",
        {A0: F, A1: F, B0: F},
        Action.FAIL,
        ("all 2 workers failed",),
        leaving=(B0,),
    ),
    Case("everyone-left", {}, Action.RESUME, ("left gracefully",), leaving=(A0, A1, B0), limit=0),
    Case(
        "rollback-resumes-without-blacklisting",
        {A0: R, A1: R, B0: R},
        Action.RESUME,
        ("reset 1", "a collective failed on a[1], which rolled back"),
        rolled_back=(A1,),
    ),
    Case(
        "rollback-counts-against-the-reset-limit",
        {A0: R, A1: R, B0: R},
        Action.FAIL,
        ("reset limit 1 exceeded", "rolled back"),
        rolled_back=(B0,),
        resets=1,
        limit=1,
    ),
    Case(
        "failure-is-told-before-rollback",
        {A0: F, A1: R, B0: R},
        Action.RESUME,
        ("1 of 3 workers failed",),
        failed_hosts=frozenset({"a"}),
        rolled_back=(B0,),
    ),
    Case("non-member-ignored", {C0: F, A0: R, A1: R, B0: R}, Action.RESUME, ("no worker failed",)),
    Case(
        "all-lost-without-checkpoints-says-how-to-enable-them",
        {A0: F, A1: F, B0: F},
        Action.FAIL,
        ("all 3 workers failed", "--checkpoint-dir", "spec.checkpoint"),
    ),
    Case(
        "all-lost-with-checkpoints-resumes-from-the-newest",
        {A0: F, A1: F, B0: F},
        Action.RESUME,
        ("reset 1: all 3 workers were lost", "blacklisting hosts a, b", "newest checkpoint"),
        failed_hosts=AB,
        fallback=True,
    ),
    Case(
        "some-raised-some-lost-with-checkpoints-resumes",
        {A0: F, A1: F, B0: F},
        Action.RESUME,
        ("all 3 workers were lost",),
        failed_hosts=AB,
        fallback=True,
        script_exits=((A0, 1), (A1, 1)),
    ),
    Case(
        "some-raised-some-lost-without-checkpoints-says-how-to-enable-them",
        {A0: F, A1: F, B0: F},
        Action.FAIL,
        ("all 3 workers failed: a[0], a[1], b[0]", "--checkpoint-dir"),
        script_exits=((A0, 1), (A1, 1)),
    ),
    Case(
        "all-raised-with-checkpoints-fails-a-script-error-would-repeat",
        {A0: F, A1: F, B0: F},
        Action.FAIL,
        ("all 3 workers failed; the script failed on every worker: a[0] exit code 1", "boom"),
        fallback=True,
        script_exits=((A0, 1), (A1, 1), (B0, 1)),
    ),
    Case(
        "all-lost-with-checkpoints-past-the-reset-limit",
        {A0: F, A1: F, B0: F},
        Action.FAIL,
        ("reset limit 2 exceeded: all 3 workers were lost",),
        fallback=True,
        resets=2,
        limit=2,
    ),
    Case(
        "script-failed-everywhere-fails-with-the-exit-codes-and-the-first-log",
        {A0: R, A1: R, B0: R},
        Action.FAIL,
        ("the script failed on every worker: b[0] exit code 3, a[0] exit code 3, a[1] exit",),
        script_exits=((B0, 3), (A0, 3), (A1, 1)),
        restart_limit=5,
    ),
    Case(
        "script-failed-everywhere-some-processes-failed-too-fails-once",
        {A0: F, A1: R, B0: R},
        Action.FAIL,
        ("the script failed on every worker: a[0] exit code 1, b[0] exit code 3",),
        script_exits=((A0, 1), (B0, 3), (A1, 3)),
    ),
    Case(
        "script-failed-on-some-a-worker-lost-restarts-and-blacklists-the-lost-one",
        {A0: F, A1: R, B0: R},
        Action.RESUME,
        ("1 of 3 workers failed (a[0])", "blacklisting hosts a"),
        failed_hosts=frozenset({"a"}),
        script_exits=((A1, 3), (B0, 3)),
    ),
    Case(
        "script-failure-is-no-rollback-yet-counts-as-a-restart",
        {A0: R, A1: R, B0: R},
        Action.FAIL,
        ("restart limit 0 exceeded: the script failed on b[0] exit code 3",),
        script_exits=((B0, 3),),
        restart_limit=0,
    ),
    Case(
        "script-killed-on-one-peers-failed-after-restarts",
        {A0: R, A1: R, B0: R},
        Action.RESUME,
        ("reset 1: the script failed on b[0] killed by SIGKILL, a[0] exit code 1",),
        script_exits=((B0, -9), (A0, 1)),
        restart_limit=3,
    ),
    Case(
        "script-failed-on-some-stopped-on-others-restarts",
        {A0: R, A1: R, B0: R},
        Action.RESUME,
        ("the script failed on a[1] exit code 2", "last lines of a[1]'s log:\nboom"),
        script_exits=((A1, 2),),
    ),
    Case(
        "restart-limit-exceeded-names-the-failure",
        {A0: R, A1: R, B0: R},
        Action.FAIL,
        ("restart limit 2 exceeded: the script failed on b[0] killed by SIGKILL",),
        script_exits=((B0, -9),),
        restarts=2,
        restart_limit=2,
    ),
    Case(
        "hosts-changing-is-no-restart",
        {A0: R, A1: R, B0: R},
        Action.RESUME,
        ("no worker failed",),
        restarts=2,
        restart_limit=2,
    ),
    Case(
        "a-lost-worker-counts-as-a-restart",
        {A0: F, A1: R, B0: R},
        Action.FAIL,
        ("restart limit 0 exceeded: 1 of 3 workers failed",),
        restart_limit=0,
    ),
    Case(
        "a-rollback-counts-as-a-restart",
        {A0: R, A1: R, B0: R},
        Action.RESUME,
        ("reset 1", "rolled back"),
        rolled_back=(A1,),
        restarts=0,
        restart_limit=1,
    ),
    Case(
        "a-third-failed-round-without-a-commit-fails-with-the-exception",
        {A0: F, A1: R, B0: R},
        Action.FAIL,
        (
            "3 rounds in a row failed with no new commit: 1 of 3 workers failed (a[0])",
            "the script failed on a[0] exit code 1",
            "last lines of a[0]'s log:\nboom",
        ),
        rolled_back=(A1, B0),
        script_exits=((A0, 1),),
        stalled=2,
        stall_limit=3,
    ),
    Case(
        "a-script-failure-before-the-limit-resumes",
        {A0: F, A1: R, B0: R},
        Action.RESUME,
        ("reset 1: 1 of 3 workers failed (a[0])", "blacklisting hosts a"),
        failed_hosts=frozenset({"a"}),
        script_exits=((A0, 1),),
        stalled=1,
        stall_limit=3,
    ),
    Case(
        "rollbacks-without-a-commit-count-too",
        {A0: R, A1: R, B0: R},
        Action.FAIL,
        ("2 rounds in a row failed with no new commit: a collective failed on a[1]",),
        rolled_back=(A1,),
        stalled=1,
        stall_limit=2,
    ),
    Case(
        "hosts-changing-without-a-commit-is-no-failed-round",
        {A0: R, A1: R, B0: R},
        Action.RESUME,
        ("no worker failed",),
        stalled=5,
        stall_limit=3,
    ),
    Case(
        "no-limit-on-failed-rounds-without-a-commit",
        {A0: F, A1: R, B0: R},
        Action.RESUME,
        ("reset 1: 1 of 3 workers failed",),
        failed_hosts=frozenset({"a"}),
        stalled=50,
    ),
    Case(
        "one-lost-with-checkpoints-is-an-ordinary-reset",
        {A0: F, A1: R, B0: R},
        Action.RESUME,
        ("1 of 3 workers failed",),
        failed_hosts=frozenset({"a"}),
        fallback=True,
    ),
]


@pytest.mark.parametrize("case", DECIDE_CASES, ids=lambda case: case.name)
def test_decide_round(case: Case) -> None:
    exits = {w: ScriptExit(exit_code=code, log_tail="boom\n") for w, code in case.script_exits}
    recs = records(
        case.states, leaving=case.leaving, rolled_back=case.rolled_back, script_exits=exits
    )
    decision = decide_round(
        recs,
        resets=case.resets,
        reset_limit=case.limit,
        checkpoint_fallback=case.fallback,
        restarts=case.restarts,
        restart_limit=case.restart_limit,
        failed_rounds_without_commit=case.stalled,
        max_failed_rounds_without_commit=case.stall_limit,
    )
    assert decision.action is case.action
    if case.failed_hosts:  # blacklisted as each failed (``worker_exits``), named here
        assert f"blacklisting hosts {', '.join(sorted(case.failed_hosts))}" in decision.reason
    if decision.action is Action.RESUME:
        failed = case.failed_hosts or case.rolled_back or case.script_exits
        assert decision.after_failure is bool(failed), "a failure's reset is a restart"
    for part in case.reason_parts:
        assert part in decision.reason, decision.reason


def test_decide_shortens_long_worker_lists() -> None:
    members = tuple(WorkerId(f"h{i:02}", 0) for i in range(20))
    decision = decide_round(records({}, members=members), resets=0, reset_limit=None)
    assert decision.action is Action.WAIT
    assert "waiting for 20 of 20 workers" in decision.reason
    assert "and 12 more" in decision.reason


@pytest.mark.parametrize(
    ("available", "min_np", "since", "now", "expected"),
    [
        pytest.param(4, 4, None, 0.0, CapacityAction.PROCEED, id="enough"),
        pytest.param(8, 4, 0.0, 999.0, CapacityAction.PROCEED, id="more-than-enough-late"),
        pytest.param(3, 4, None, 500.0, CapacityAction.WAIT, id="just-started-waiting"),
        pytest.param(3, 4, 100.0, 159.9, CapacityAction.WAIT, id="within-timeout"),
        pytest.param(3, 4, 100.0, 160.0, CapacityAction.TIMEOUT, id="timeout-reached"),
        pytest.param(0, 1, 100.0, 1000.0, CapacityAction.TIMEOUT, id="long-past-timeout"),
    ],
)
def test_decide_capacity(
    available: int, min_np: int, since: float | None, now: float, expected: CapacityAction
) -> None:
    action = decide_capacity(
        available_slots=available,
        min_np=min_np,
        waiting_since=since,
        now=now,
        elastic_timeout_s=60.0,
    )
    assert action is expected


RUNNING, FORMING, STARTING, FINISHED = (
    DriverPhase.RUNNING,
    DriverPhase.FORMING,
    DriverPhase.STARTING,
    DriverPhase.FINISHED,
)
LEAVING, DISMISSED, FAILED = Departure.LEAVING, Departure.DISMISSED, Departure.FAILED


# ---- classify_ready --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "known", "member", "after", "rolled_back", "verdict"),
    [
        pytest.param(RUNNING, False, True, 3, False, ReadyVerdict.UNKNOWN, id="unknown"),
        pytest.param(RUNNING, True, False, 0, False, ReadyVerdict.WAITING, id="newcomer"),
        pytest.param(RUNNING, True, True, 2, True, ReadyVerdict.WAITING, id="stale-round"),
        pytest.param(RUNNING, True, True, 3, False, ReadyVerdict.READY, id="member-ready"),
        pytest.param(RUNNING, True, True, 3, True, ReadyVerdict.ROLLED_BACK, id="rolled-back"),
        pytest.param(
            FORMING, True, True, 3, True, ReadyVerdict.ROLLED_BACK, id="rolled-back-forming"
        ),
        pytest.param(FINISHED, True, True, 3, True, ReadyVerdict.READY, id="finished"),
    ],
)
def test_classify_ready(
    phase: DriverPhase,
    known: bool,
    member: bool,
    after: int,
    rolled_back: bool,
    verdict: ReadyVerdict,
) -> None:
    assert (
        classify_ready(
            phase,
            known=known,
            member=member,
            after_round=after,
            current_round=3,
            rolled_back=rolled_back,
        )
        is verdict
    )


@pytest.mark.parametrize(
    ("phase", "after", "rolled_back", "verdict"),
    [
        pytest.param(RUNNING, 3, False, ReadyVerdict.SCRIPT_FAILED, id="script-failed"),
        pytest.param(
            RUNNING, 3, True, ReadyVerdict.SCRIPT_FAILED, id="older-agent-says-rolled-back-too"
        ),
        pytest.param(FORMING, 3, False, ReadyVerdict.SCRIPT_FAILED, id="script-failed-forming"),
        pytest.param(RUNNING, 2, False, ReadyVerdict.WAITING, id="stale-round"),
        pytest.param(FINISHED, 3, False, ReadyVerdict.READY, id="finished"),
    ],
)
def test_classify_ready_of_a_script_that_failed_on_its_own(
    phase: DriverPhase, after: int, rolled_back: bool, verdict: ReadyVerdict
) -> None:
    """A restart-mode agent says its script failed with ``script_exit``, never as a rollback
    (an agent of protocols 7 to 9 sent ``rolled_back`` with it)."""
    ready = classify_ready(
        phase,
        known=True,
        member=True,
        after_round=after,
        current_round=3,
        rolled_back=rolled_back,
        script_failed=True,
    )
    assert ready is verdict


# ---- leaving_members -------------------------------------------------------------------


def worker_records(**changes: dict[str, object]) -> dict[WorkerId, WorkerRecord]:
    """Running members of round 1 (a[0], a[1], b[0]) at the barrier, with ``changes`` per
    worker name (``a0=dict(running=False)``)."""
    out = {}
    for worker in (A0, A1, B0):
        key = f"{worker.hostname}{worker.local_rank}"
        fields: dict[str, object] = {"started_at": 0.0, "waiting_after": 1, "last_round": 1}
        fields.update(changes.get(key, {}))
        out[worker] = WorkerRecord(**fields)  # type: ignore[arg-type]
    return out


@pytest.mark.parametrize(
    ("phase", "removed", "changes", "expected"),
    [
        pytest.param(RUNNING, ["a"], {}, {A0, A1}, id="host-a-leaves"),
        pytest.param(FORMING, ["a"], {}, set(), id="not-while-forming"),
        pytest.param(RUNNING, ["a"], {"a0": {"running": False}}, {A1}, id="ended-member-stays"),
        pytest.param(RUNNING, ["a"], {"a1": {"departure": LEAVING}}, {A0}, id="already-leaving"),
        pytest.param(
            RUNNING, ["a"], {"a0": {"ending_since": 5.0}}, {A1}, id="reported-its-end-stays"
        ),
        pytest.param(RUNNING, ["z"], {}, set(), id="not-a-member-host"),
    ],
)
def test_leaving_members(
    phase: DriverPhase,
    removed: list[str],
    changes: dict[str, dict[str, object]],
    expected: set[WorkerId],
) -> None:
    workers = worker_records(**changes)
    assert leaving_members(phase, removed, [A0, A1, B0], workers) == expected


# ---- plan_round ------------------------------------------------------------------------

SETTINGS = DriverSettings(min_np=2, max_np=3, elastic_timeout_s=60.0)
AB_HOSTS = (("a", 2), ("b", 2))


FALLBACK = DriverSettings(min_np=2, max_np=3, elastic_timeout_s=60.0, checkpoint_fallback=True)
AB_SLOTS = assign_slots(AB_HOSTS, min_np=2, max_np=3)
BA_SLOTS = assign_slots((("b", 1), ("a", 2)), min_np=2, max_np=3)
BLACKLISTED = Capacity((), every_host_blacklisted=True, blacklisted=("a", "b"))


@pytest.mark.parametrize(
    ("capacity", "settings", "survivors", "since", "expected"),
    [
        pytest.param(Capacity(AB_HOSTS), SETTINGS, None, None, FormRound(AB_SLOTS), id="first"),
        pytest.param(
            Capacity(AB_HOSTS), SETTINGS, (A0, B0), None, FormRound(AB_SLOTS), id="rank0-survives"
        ),
        pytest.param(
            Capacity((("b", 1), ("a", 2))),
            SETTINGS,
            (A0,),
            None,
            EndJob("its rank 0 would be the fresh process b[0], not one of the previous round's"),
            id="rank0-not-a-survivor",
        ),
        pytest.param(
            Capacity(AB_HOSTS),
            SETTINGS,
            (),
            None,
            EndJob("no worker of the previous round survives to hold the trained state"),
            id="no-survivor-fails-without-checkpoints",
        ),
        pytest.param(
            Capacity(AB_HOSTS),
            SETTINGS,
            (A1,),
            None,
            EndJob("spec.checkpoint"),
            id="fresh-process-on-a-survivors-host-is-no-survivor",
        ),
        pytest.param(
            Capacity(AB_HOSTS),
            FALLBACK,
            (),
            None,
            FormRound(AB_SLOTS, from_checkpoint=True),
            id="no-survivor-starts-from-the-checkpoint",
        ),
        pytest.param(
            Capacity((("b", 1), ("a", 2))),
            FALLBACK,
            (A0,),
            None,
            FormRound(BA_SLOTS, from_checkpoint=True),
            id="fresh-rank0-starts-from-the-checkpoint",
        ),
        pytest.param(
            Capacity(AB_HOSTS), FALLBACK, (A0,), None, FormRound(AB_SLOTS), id="survivor-no-ckpt"
        ),
        pytest.param(
            Capacity((("a", 1),)),
            SETTINGS,
            None,
            None,
            AwaitCapacity(100.0, "1 slots available on 1 hosts, but the job needs at least 2"),
            id="starts-waiting",
        ),
        pytest.param(
            Capacity((("a", 1),)),
            SETTINGS,
            None,
            70.0,
            AwaitCapacity(70.0, "waiting up to 60 s"),
            id="keeps-waiting",
        ),
        pytest.param(
            Capacity((("a", 1),)),
            SETTINGS,
            None,
            40.0,
            EndJob("elastic timeout: 1 slots available"),
            id="elastic-timeout",
        ),
        pytest.param(
            BLACKLISTED,
            SETTINGS,
            None,
            None,
            EndJob("every discovered host is blacklisted: ['a', 'b']"),
            id="every-host-blacklisted",
        ),
        pytest.param(
            BLACKLISTED,
            FALLBACK,
            (),
            50.0,
            AwaitCapacity(50.0, "every discovered host is blacklisted: ['a', 'b']"),
            id="every-host-blacklisted-waits-for-a-cooldown-with-checkpoints",
        ),
        pytest.param(
            BLACKLISTED,
            FALLBACK,
            (),
            30.0,
            EndJob("elastic timeout: 0 slots available"),
            id="every-host-blacklisted-past-the-elastic-timeout",
        ),
    ],
)
def test_plan_round(
    capacity: Capacity,
    settings: DriverSettings,
    survivors: tuple[WorkerId, ...] | None,
    since: float | None,
    expected: NextRound,
) -> None:
    plan = plan_round(capacity, settings, survivors=survivors, waiting_since=since, now=100.0)
    assert type(plan) is type(expected)
    if isinstance(expected, FormRound):
        assert plan == expected
    elif isinstance(expected, EndJob):
        assert isinstance(plan, EndJob) and expected.reason in plan.reason, plan
    else:
        assert isinstance(plan, AwaitCapacity) and isinstance(expected, AwaitCapacity)
        assert plan.since == expected.since and expected.message in plan.message, plan


ONE_SLOT = DriverSettings(min_np=2, max_np=3, elastic_timeout_s=60.0)
HALVES = {A0: HeldShards(shards=2, own=0), B0: HeldShards(shards=2, own=1)}


@pytest.mark.parametrize(
    ("hosts", "held", "order"),
    [
        pytest.param(
            (("a", 1), ("b", 1), ("c", 1)), HALVES, ["a", "c", "b"], id="newcomer-between"
        ),
        pytest.param((("a", 1), ("b", 1), ("c", 1)), {}, ["a", "b", "c"], id="nothing-held"),
        pytest.param(
            (("a", 1), ("b", 1), ("c", 1), ("d", 1)),
            HALVES,
            ["a", "c", "b"],
            id="the-hosts-max-np-leaves-out-stay-out",
        ),
        pytest.param(
            (("a", 1), ("c", 2), ("b", 1)),
            HALVES,
            ["a", "c", "c"],
            id="a-survivor-max-np-leaves-out-stays-out",
        ),
    ],
)
def test_plan_round_places_a_sharded_states_newcomers_between_the_survivors(
    hosts: tuple[tuple[str, int], ...], held: dict[WorkerId, HeldShards], order: list[str]
) -> None:
    plan = plan_round(
        Capacity(hosts), ONE_SLOT, survivors=(A0, B0), waiting_since=None, now=0.0, held=held
    )
    assert isinstance(plan, FormRound) and not plan.from_checkpoint, plan
    assert [worker.hostname for worker in plan.slots] == order
    assert [slot.rank for slot in plan.slots.values()] == list(range(len(order)))


# ---- decide_formation ------------------------------------------------------------------

PLAN_AB: dict[WorkerId, SlotInfo] = assign_slots((("a", 2), ("b", 1)), min_np=1, max_np=None)


@pytest.mark.parametrize(
    ("changes", "current", "recovering", "expected"),
    [
        pytest.param(
            {"b0": {"waiting_after": 0}}, 1, False, AwaitBarrier((B0,)), id="b0-still-training"
        ),
        pytest.param(
            {"a1": {"running": False}}, 1, False, AwaitBarrier((A1,)), id="a1-has-no-process"
        ),
        pytest.param(
            {"b0": {"last_round": 0, "waiting_after": None}},
            0,
            False,
            AwaitBarrier((B0,)),
            id="unregistered-starter",
        ),
        pytest.param(
            {"b0": {"departure": DISMISSED}},
            1,
            False,
            AwaitBarrier((B0,)),
            id="b0-dismissed-its-host-back: its exit, then a fresh process",
        ),
        pytest.param({}, 1, False, Publish(2, PLAN_AB, False, (), ()), id="hosts-changed"),
        pytest.param({}, 1, True, Publish(2, PLAN_AB, True, (), ()), id="after-failure-syncs"),
        pytest.param(
            {w: {"last_round": 0, "waiting_after": 0} for w in ("a0", "a1", "b0")},
            0,
            False,
            Publish(1, PLAN_AB, True, (A0, A1, B0), ()),
            id="first-round-syncs",
        ),
        pytest.param(
            {"b0": {"last_round": 0, "waiting_after": 0}},
            1,
            False,
            Publish(2, PLAN_AB, True, (B0,), ()),
            id="newcomer-syncs",
        ),
    ],
)
def test_decide_formation(
    changes: dict[str, dict[str, object]],
    current: int,
    recovering: bool,
    expected: AwaitBarrier | Publish,
) -> None:
    workers = worker_records(**changes)
    assert (
        decide_formation(PLAN_AB, workers, current_round=current, recovering=recovering) == expected
    )


def test_decide_formation_dismisses_running_workers_without_a_place() -> None:
    workers = worker_records()
    c0 = WorkerId("c", 0)
    workers[c0] = WorkerRecord(started_at=0.0, waiting_after=1, last_round=1)
    workers[WorkerId("d", 0)] = WorkerRecord(started_at=0.0, running=False)
    workers[WorkerId("e", 0)] = WorkerRecord(started_at=0.0, departure=DISMISSED)
    publish = decide_formation(PLAN_AB, workers, current_round=1, recovering=False)
    assert isinstance(publish, Publish) and publish.outgoing == (c0,)


# ---- decide_scale_out ------------------------------------------------------------------

PLAN_ABC = FormRound(assign_slots((("a", 2), ("b", 1), ("c", 1)), min_np=1, max_np=None))


@pytest.mark.parametrize(
    ("plan", "newcomer", "leaving", "announced", "recovering", "expected"),
    [
        pytest.param(PLAN_ABC, "none", False, False, False, ScaleOutAction.PREPARE, id="launch"),
        pytest.param(
            PLAN_ABC, "started", False, False, False, ScaleOutAction.PREPARE, id="starting"
        ),
        pytest.param(
            PLAN_ABC, "registered", False, False, False, ScaleOutAction.ANNOUNCE, id="registered"
        ),
        pytest.param(
            PLAN_ABC,
            "registered",
            False,
            False,
            True,
            ScaleOutAction.PREPARE,
            id="not-while-failing",
        ),
        pytest.param(
            PLAN_ABC, "registered", True, False, False, ScaleOutAction.NONE, id="members-leaving"
        ),
        pytest.param(
            PLAN_ABC, "registered", False, True, False, ScaleOutAction.NONE, id="announced"
        ),
        pytest.param(
            FormRound(PLAN_AB), "none", False, False, False, ScaleOutAction.NONE, id="no-newcomer"
        ),
        pytest.param(
            AwaitCapacity(0.0, "short"),
            "registered",
            False,
            False,
            False,
            ScaleOutAction.NONE,
            id="short",
        ),
    ],
)
def test_decide_scale_out(
    plan: NextRound,
    newcomer: str,
    leaving: bool,
    announced: bool,
    recovering: bool,
    expected: ScaleOutAction,
) -> None:
    """``newcomer``: how far c[0] is (no process, started, registered)."""
    workers = worker_records()
    if newcomer == "started":
        workers[C0] = WorkerRecord(started_at=0.0)
    elif newcomer == "registered":
        workers[C0] = WorkerRecord(started_at=0.0, waiting_after=0)
    decision = decide_scale_out(
        plan, PLAN_AB, workers, leaving=leaving, announced=announced, recovering=recovering
    )
    assert decision.action is expected
    if expected is not ScaleOutAction.NONE:
        assert decision.newcomers == (C0,)


# ---- discovery failures ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("discovered_before", "expected"),
    [
        pytest.param(
            False, EndJob("host discovery failed: script exited with status 1"), id="first"
        ),
        pytest.param(True, None, id="later-retried"),
    ],
)
def test_decide_discovery_failure(discovered_before: bool, expected: EndJob | None) -> None:
    decision = decide_discovery_failure(
        "script exited with status 1", discovered_before=discovered_before
    )
    assert decision == expected


@pytest.mark.parametrize(
    ("since", "expected"),
    [
        pytest.param(
            None,
            AwaitCapacity(100.0, "waiting up to 60 s; the last host discovery failed: boom"),
            id="waiting",
        ),
        pytest.param(
            40.0,
            EndJob("for 60 s; the last host discovery failed: boom"),
            id="elastic-timeout",
        ),
    ],
)
def test_plan_round_reports_a_failing_discovery(since: float | None, expected: NextRound) -> None:
    capacity = Capacity((("a", 1),), discovery_error="boom")
    plan = plan_round(capacity, SETTINGS, survivors=None, waiting_since=since, now=100.0)
    if isinstance(expected, EndJob):
        assert isinstance(plan, EndJob) and plan.reason.endswith(expected.reason), plan
    else:
        assert isinstance(expected, AwaitCapacity) and isinstance(plan, AwaitCapacity)
        assert plan.since == expected.since and plan.message.endswith(expected.message), plan
