"""Table tests of what a worker's end means and what follows it
(``elasticjob.driver.worker_exits``)."""

from __future__ import annotations

import pytest

from elasticjob.driver.driver_types import Departure, DriverPhase
from elasticjob.driver.worker_exits import (
    NO_EFFECTS,
    ExitCause,
    ExitEffects,
    ExitVerdict,
    classify_exit,
    decide_exit,
)

# ---- classify_exit ---------------------------------------------------------------------

RUNNING, FORMING, STARTING, FINISHED = (
    DriverPhase.RUNNING,
    DriverPhase.FORMING,
    DriverPhase.STARTING,
    DriverPhase.FINISHED,
)
LEAVING, DISMISSED, FAILED = Departure.LEAVING, Departure.DISMISSED, Departure.FAILED


@pytest.mark.parametrize(
    ("phase", "member", "departure", "code", "verdict"),
    [
        pytest.param(
            RUNNING, True, LEAVING, 137, ExitVerdict.LEFT_MID_ROUND, id="leaving-member-killed"
        ),
        pytest.param(RUNNING, True, LEAVING, 0, ExitVerdict.DEPARTED, id="leaving-exits-0"),
        pytest.param(FORMING, True, LEAVING, 137, ExitVerdict.DEPARTED, id="leaving-forming"),
        pytest.param(RUNNING, False, LEAVING, 137, ExitVerdict.DEPARTED, id="leaving-no-member"),
        pytest.param(RUNNING, False, DISMISSED, 0, ExitVerdict.DEPARTED, id="dismissed-exits"),
        pytest.param(FORMING, False, FAILED, -15, ExitVerdict.ALREADY_FAILED, id="stopped"),
        pytest.param(FINISHED, True, None, 1, ExitVerdict.IGNORED, id="job-finished"),
        pytest.param(RUNNING, True, None, 0, ExitVerdict.SUCCEEDED, id="member-succeeds"),
        pytest.param(RUNNING, True, None, 137, ExitVerdict.FAILED, id="member-fails"),
        pytest.param(
            FORMING, True, None, 1, ExitVerdict.FAILED_OUTSIDE_ROUND, id="member-fails-forming"
        ),
        pytest.param(
            RUNNING, False, None, 1, ExitVerdict.FAILED_OUTSIDE_ROUND, id="newcomer-fails"
        ),
        pytest.param(
            STARTING, False, None, 0, ExitVerdict.ENDED_OUTSIDE_ROUND, id="starter-exits-0"
        ),
    ],
)
def test_classify_exit(
    phase: DriverPhase, member: bool, departure: Departure | None, code: int, verdict: ExitVerdict
) -> None:
    assert classify_exit(phase, member=member, departure=departure, exit_code=code) is verdict


def test_a_leaving_member_that_ends_at_the_barrier_departs() -> None:
    """It stopped with the others at their agreed check: nobody waits for it any more."""
    got = classify_exit(RUNNING, member=True, departure=LEAVING, exit_code=137, at_barrier=True)
    assert got is ExitVerdict.DEPARTED


@pytest.mark.parametrize(
    ("phase", "code", "verdict"),
    [
        (STARTING, 0, ExitVerdict.ENDED_WITHOUT_JOINING),
        (RUNNING, 0, ExitVerdict.ENDED_WITHOUT_JOINING),  # a newcomer
        (STARTING, 1, ExitVerdict.FAILED_OUTSIDE_ROUND),
        (FINISHED, 0, ExitVerdict.IGNORED),
    ],
)
def test_classify_exit_of_a_process_that_never_asked_for_a_round(
    phase: DriverPhase, code: int, verdict: ExitVerdict
) -> None:
    got = classify_exit(phase, member=False, departure=None, exit_code=code, registered=False)
    assert got is verdict


@pytest.mark.parametrize(
    ("phase", "member", "code", "verdict"),
    [
        pytest.param(RUNNING, True, -15, ExitVerdict.SUCCEEDED, id="member-terminated"),
        pytest.param(RUNNING, True, -9, ExitVerdict.SUCCEEDED, id="member-killed"),
        pytest.param(FORMING, True, -15, ExitVerdict.ENDED_OUTSIDE_ROUND, id="round-failed"),
        pytest.param(FINISHED, True, -15, ExitVerdict.IGNORED, id="job-finished"),
    ],
)
def test_classify_exit_of_a_process_stopped_after_it_reported_success(
    phase: DriverPhase, member: bool, code: int, verdict: ExitVerdict
) -> None:
    """Its training function returned; its teardown hung until the driver stopped it."""
    got = classify_exit(
        phase, member=member, departure=None, exit_code=code, stopped_after_success=True
    )
    assert got is verdict


# ---- decide_exit -----------------------------------------------------------------------

EXITED, KILLED, VANISHED, OVERDUE, UNHEALTHY = (
    ExitCause.EXITED,
    ExitCause.KILLED,
    ExitCause.VANISHED,
    ExitCause.OVERDUE,
    ExitCause.UNHEALTHY,
)
STRUCK = ExitEffects(blacklist=True, announce=True, replace=True)
"""A failure of the worker's own, outside a round that it fails."""
ROUND_BROKEN = ExitEffects(blacklist=True, fail_round=True, announce=True, replace=True)


@pytest.mark.parametrize(
    ("verdict", "cause", "code", "recovering", "effects"),
    [
        pytest.param(ExitVerdict.FAILED, EXITED, 137, False, ROUND_BROKEN, id="member-fails"),
        pytest.param(
            ExitVerdict.FAILED, EXITED, 137, True, STRUCK, id="member-fails-in-a-failed-round"
        ),
        pytest.param(ExitVerdict.FAILED, KILLED, 1, False, ROUND_BROKEN, id="member-killed"),
        pytest.param(
            ExitVerdict.FAILED,
            VANISHED,
            137,
            False,
            ExitEffects(fail_round=True),
            id="member-vanishes",
        ),
        pytest.param(
            ExitVerdict.FAILED,
            OVERDUE,
            1,
            False,
            ExitEffects(fail_round=True, replace=True),
            id="member-overdue",
        ),
        pytest.param(
            ExitVerdict.FAILED_OUTSIDE_ROUND, EXITED, 1, False, STRUCK, id="newcomer-fails"
        ),
        pytest.param(None, EXITED, 1, False, STRUCK, id="never-launched-fails"),
        pytest.param(None, KILLED, 1, False, STRUCK, id="never-launched-killed"),
        pytest.param(
            ExitVerdict.DEPARTED,
            EXITED,
            143,
            False,
            ExitEffects(announce=True, replace=True),
            id="leaving-fails",
        ),
        pytest.param(
            ExitVerdict.LEFT_MID_ROUND,
            EXITED,
            137,
            False,
            ExitEffects(fail_round=True, announce=True, replace=True),
            id="leaving-member-killed",
        ),
        pytest.param(
            ExitVerdict.LEFT_MID_ROUND,
            EXITED,
            137,
            True,
            ExitEffects(announce=True, replace=True),
            id="leaving-member-killed-in-a-failed-round",
        ),
        pytest.param(
            ExitVerdict.LEFT_MID_ROUND,
            VANISHED,
            137,
            False,
            ExitEffects(fail_round=True),
            id="leaving-member-vanishes",
        ),
        pytest.param(
            ExitVerdict.LEFT_MID_ROUND,
            OVERDUE,
            137,
            False,
            ExitEffects(fail_round=True, replace=True),
            id="leaving-member-overdue",
        ),
        pytest.param(
            ExitVerdict.ALREADY_FAILED,
            EXITED,
            -15,
            False,
            ExitEffects(announce=True, replace=True),
            id="struck-already",
        ),
        pytest.param(
            ExitVerdict.IGNORED,
            EXITED,
            1,
            False,
            ExitEffects(announce=True, replace=True),
            id="job-finished",
        ),
        pytest.param(None, VANISHED, 137, False, NO_EFFECTS, id="never-launched-vanishes"),
        pytest.param(
            ExitVerdict.DEPARTED,
            OVERDUE,
            1,
            False,
            ExitEffects(replace=True),
            id="did-not-leave-in-time",
        ),
        pytest.param(
            None,
            UNHEALTHY,
            3,
            False,
            ExitEffects(blacklist=True, replace=True),
            id="health-check-failed",
        ),
        pytest.param(ExitVerdict.SUCCEEDED, EXITED, 0, False, NO_EFFECTS, id="member-succeeds"),
        pytest.param(
            ExitVerdict.SUCCEEDED, EXITED, -15, False, NO_EFFECTS, id="stopped-after-success"
        ),
        pytest.param(
            ExitVerdict.ENDED_WITHOUT_JOINING, EXITED, 0, False, NO_EFFECTS, id="never-joined"
        ),
    ],
)
def test_decide_exit(
    verdict: ExitVerdict | None,
    cause: ExitCause,
    code: int,
    recovering: bool,
    effects: ExitEffects,
) -> None:
    assert decide_exit(verdict, cause, code, recovering=recovering) == effects


def test_the_effects_of_a_pods_workers_together_are_each_that_any_has() -> None:
    one = ExitEffects(blacklist=True, replace=True)
    other = ExitEffects(fail_round=True, replace=True)
    assert ExitEffects.of_all([one, other]) == ExitEffects(
        blacklist=True, fail_round=True, replace=True
    )
    assert ExitEffects.of_all([]) == NO_EFFECTS


SLOT_ENDED = ExitCause.SLOT_ENDED
RESTARTED = ExitEffects(fail_round=True, announce=True, restart=True)


@pytest.mark.parametrize(
    ("verdict", "cause", "code", "recovering", "restart_slot", "effects"),
    [
        pytest.param(
            ExitVerdict.FAILED, SLOT_ENDED, 137, False, True, RESTARTED, id="its-slot-restarts"
        ),
        pytest.param(
            ExitVerdict.FAILED,
            SLOT_ENDED,
            1,
            True,
            True,
            ExitEffects(announce=True, restart=True),
            id="its-slot-restarts-in-a-failed-round",
        ),
        pytest.param(
            ExitVerdict.FAILED, SLOT_ENDED, 137, False, False, ROUND_BROKEN, id="its-host-dropped"
        ),
        pytest.param(
            ExitVerdict.FAILED, EXITED, 137, False, True, ROUND_BROKEN, id="only-a-living-host"
        ),
        pytest.param(
            ExitVerdict.FAILED_OUTSIDE_ROUND, SLOT_ENDED, 1, False, True, STRUCK, id="no-member"
        ),
        pytest.param(
            ExitVerdict.SUCCEEDED, SLOT_ENDED, 0, False, True, NO_EFFECTS, id="member-succeeds"
        ),
    ],
)
def test_decide_exit_of_a_slot_whose_host_lives_on(
    verdict: ExitVerdict,
    cause: ExitCause,
    code: int,
    recovering: bool,
    restart_slot: bool,
    effects: ExitEffects,
) -> None:
    """A failed member's slot restarts in place only where its host lives on and the plan of
    ``slot_loss.py`` says so: nothing struck or removed, the round failed once."""
    got = decide_exit(verdict, cause, code, recovering=recovering, restart_slot=restart_slot)
    assert got == effects
