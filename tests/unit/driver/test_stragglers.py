"""Stragglers: the rule (a row per branch), and the driver flagging and replacing a slow member
of a running round, its paces sent with heartbeats through the real in-memory rendezvous."""

from __future__ import annotations

import pytest

from elasticjob.driver.stragglers import (
    MIN_STEPS,
    Straggler,
    StragglerPolicy,
    find_stragglers,
)
from elasticjob.wire.messages import HeartbeatRequest, NoticeKind, StepPace, WorkerId
from tests.support.driver_job import A0, B0, C0, Job, settings

POLICY = StragglerPolicy(slowdown=1.5, for_s=60.0)
ROUND = 4


def pace(busy_s: float, steps: int = MIN_STEPS, round_number: int = ROUND) -> StepPace:
    return StepPace(round=round_number, steps=steps, busy_s=busy_s)


def find(
    paces: dict[WorkerId, StepPace | None],
    before: dict[WorkerId, Straggler] | None = None,
    now: float = 100.0,
) -> dict[WorkerId, Straggler]:
    return find_stragglers(paces, ROUND, before or {}, POLICY, now)


SLOW_SINCE_50 = {C0: Straggler(since=50.0, slowdown=2.0, flagged=False)}


@pytest.mark.parametrize(
    ("paces", "before", "found"),
    [
        pytest.param({A0: pace(0.1), B0: pace(0.1), C0: pace(0.1)}, None, {}, id="all-alike"),
        pytest.param({A0: pace(0.1), B0: pace(0.1), C0: pace(0.2)}, None,
                     {C0: Straggler(100.0, 2.0, False)}, id="slow-from-now"),
        pytest.param({A0: pace(0.1), B0: pace(0.1), C0: pace(0.2)}, SLOW_SINCE_50,
                     {C0: Straggler(50.0, 2.0, False)}, id="slow-not-long-enough"),
        pytest.param({A0: pace(0.1), B0: pace(0.1), C0: pace(0.2)},
                     {C0: Straggler(40.0, 2.0, False)}, {C0: Straggler(40.0, 2.0, True)},
                     id="flagged-after-staying-slow"),
        pytest.param({A0: pace(0.1), B0: pace(0.1), C0: pace(0.14)}, SLOW_SINCE_50, {},
                     id="below-the-slowdown-the-clock-starts-again"),
        pytest.param({A0: pace(0.1), B0: pace(0.1), C0: pace(0.2, steps=MIN_STEPS - 1)}, None,
                     {}, id="a-rounds-first-steps-never-count"),
        pytest.param({A0: pace(0.1), B0: pace(0.1), C0: pace(0.2, round_number=ROUND - 1)},
                     None, {}, id="a-pace-of-an-older-round"),
        pytest.param({A0: pace(0.1), C0: None}, None, {}, id="one-member-reporting"),
        pytest.param({A0: pace(0.001), B0: pace(0.001), C0: pace(0.004)}, None, {},
                     id="steps-too-short-to-tell"),
        pytest.param({A0: pace(0.1), C0: pace(0.2)}, None, {C0: Straggler(100.0, 2.0, False)},
                     id="two-members"),
    ],
)  # fmt: skip
def test_find_stragglers(
    paces: dict[WorkerId, StepPace | None],
    before: dict[WorkerId, Straggler] | None,
    found: dict[WorkerId, Straggler],
) -> None:
    assert find(paces, before) == found


def test_the_policy_refuses_a_slowdown_that_flags_everyone() -> None:
    with pytest.raises(ValueError, match="slowdown must be > 1"):
        StragglerPolicy(slowdown=1.0)


async def beat(job: Job, worker: WorkerId, busy_s: float, round_number: int = 1) -> None:
    job.job.report_heartbeat(
        HeartbeatRequest(
            hostname=worker.hostname,
            local_rank=worker.local_rank,
            pace=StepPace(round=round_number, steps=MIN_STEPS, busy_s=busy_s),
        )
    )


@pytest.mark.parametrize("replace", [False, True], ids=["report", "replace"])
async def test_a_member_slow_for_long_enough_is_flagged_once(replace: bool) -> None:
    policy = StragglerPolicy(slowdown=1.5, for_s=30.0, replace=replace)
    job = Job({"a": 1, "b": 1, "c": 1}, settings(stragglers=policy))  # type: ignore[arg-type]
    await job.start_round_1(A0, B0, C0)
    for worker, busy in ((A0, 0.1), (B0, 0.1), (C0, 0.3)):
        await beat(job, worker, busy)
    await job.step()
    assert not job.driver.stragglers[C0].flagged
    job.clock.advance(30.0)
    await beat(job, C0, 0.3)
    await job.step()
    await job.step()
    assert job.driver.stragglers[C0].flagged and job.driver.stragglers[C0].slowdown == 3.0
    assert job.driver.journal.stragglers_found == 1, "flagged once"
    notices = await job.notices()
    if replace:
        assert notices == [(NoticeKind.HOSTS_REMOVED, ("c",))]
        assert "c" in job.driver.hosts.blacklist
    else:
        assert notices == [] and "c" not in job.driver.hosts.blacklist


async def test_a_straggler_that_catches_up_is_no_longer_one() -> None:
    job = Job({"a": 1, "b": 1}, settings())
    await job.start_round_1(A0, B0)
    await beat(job, A0, 0.1)
    await beat(job, B0, 0.3)
    await job.step()
    assert B0 in job.driver.stragglers
    await beat(job, B0, 0.1)
    await job.step()
    assert job.driver.stragglers == {}
