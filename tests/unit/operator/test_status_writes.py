"""When a job's status is written (``status_writer.write_due``): a table of changes; which
observations make statuses that differ in their progress alone (``without_progress``); and
the writer, which makes no status at all while only the progress changed and is not due."""

from __future__ import annotations

from typing import Any, cast

import pytest

from elasticjob.driver.driver_types import JobResult
from elasticjob.operator import status_writer
from elasticjob.operator.api import Goodput, LostSeconds, Progress, StragglerStatus
from elasticjob.operator.kube import KubeApi
from elasticjob.operator.status_observation import Observation
from elasticjob.operator.status_render import status_of
from elasticjob.operator.status_writer import (
    PROGRESS_WRITE_INTERVAL_S,
    StatusWriter,
    without_progress,
    write_due,
)
from tests.support.clock import FakeClock
from tests.support.observations import obs

BASE: dict[str, Any] = {
    "phase": "Running",
    "round": 2,
    "worldSize": 4,
    "progress": {"epoch": 1, "step": 100, "samplesPerSecond": 50.0},
    "goodput": {"ratio": 0.9, "lostSeconds": {"recovery": 3.0}, "lastRecoverySeconds": 1.5},
}


def changed(**fields: Any) -> dict[str, Any]:
    return {**BASE, **fields}


SOON, LATER = 1.0, PROGRESS_WRITE_INTERVAL_S


@pytest.mark.parametrize(
    ("last", "status", "since", "ended", "expected"),
    [
        pytest.param(None, BASE, SOON, False, True, id="first-write"),
        pytest.param(BASE, BASE, LATER, False, False, id="unchanged"),
        pytest.param(BASE, BASE, SOON, True, True, id="ended-unchanged"),
        pytest.param(BASE, changed(round=3), SOON, False, True, id="round-changed"),
        pytest.param(BASE, changed(phase="Recovering"), SOON, False, True, id="phase-changed"),
        pytest.param(
            BASE, changed(progress={"epoch": 1, "step": 101}), SOON, False, False, id="step-soon"
        ),
        pytest.param(
            BASE, changed(progress={"epoch": 1, "step": 101}), LATER, False, True, id="step-later"
        ),
        pytest.param(
            BASE,
            changed(goodput={**BASE["goodput"], "ratio": 0.91}),
            SOON,
            False,
            False,
            id="goodput-ratio-soon",
        ),
        pytest.param(
            BASE,
            changed(goodput={**BASE["goodput"], "lastRecoverySeconds": 0.4}),
            SOON,
            False,
            True,
            id="new-recovery",
        ),
        pytest.param(
            BASE,
            changed(progress={"step": 101}, worldSize=3),
            SOON,
            False,
            True,
            id="step-and-size",
        ),
        pytest.param(BASE, changed(progress={"step": 101}), SOON, True, True, id="ended-step-soon"),
        pytest.param(
            changed(stragglers=[{"pod": "p", "rank": 1, "slowdown": 2.0, "flagged": False}]),
            changed(stragglers=[{"pod": "p", "rank": 1, "slowdown": 2.1, "flagged": False}]),
            SOON,
            False,
            False,
            id="straggler-slowdown-soon",
        ),
        pytest.param(
            changed(stragglers=[{"pod": "p", "rank": 1, "slowdown": 2.0, "flagged": False}]),
            changed(stragglers=[{"pod": "p", "rank": 1, "slowdown": 2.0, "flagged": True}]),
            SOON,
            False,
            True,
            id="straggler-flagged",
        ),
        pytest.param(
            BASE, changed(progress={"step": 101}), -SOON, False, True, id="clock-stepped-back"
        ),
    ],
)
def test_write_due(
    last: dict[str, Any] | None,
    status: dict[str, Any],
    since: float,
    ended: bool,
    expected: bool,
) -> None:
    assert write_due(last, status, last_at=100.0, now=100.0 + since, ended=ended) is expected


def observation(**changes: Any) -> Observation:
    """A job training 3 workers in round 4, at step 100."""
    progress = Progress(epoch=1, step=100)
    goodput = Goodput(ratio=0.9, lost_seconds=LostSeconds(startup=2.0))
    return obs(**{"progress": progress, "goodput": goodput, **changes})


@pytest.mark.parametrize(
    ("other", "same"),
    [
        pytest.param(observation(), True, id="equal"),
        pytest.param(observation(progress=Progress(epoch=1, step=101)), True, id="step"),
        pytest.param(observation(progress=None), True, id="no-progress"),
        pytest.param(
            observation(goodput=Goodput(ratio=0.8, lost_seconds=LostSeconds(startup=3.0))),
            True,
            id="goodput-running-figures",
        ),
        pytest.param(
            observation(goodput=Goodput(ratio=0.9, last_recovery_seconds=1.0)),
            False,
            id="new-recovery",
        ),
        pytest.param(observation(round=5), False, id="round"),
        pytest.param(
            observation(stragglers=[StragglerStatus(pod="b", rank=1, slowdown=2.5)]),
            False,
            id="a-straggler-found",
        ),
        pytest.param(observation(result=JobResult(True, "done", 4, 0)), False, id="ended"),
    ],
)
def test_which_observations_differ_in_their_progress_alone(other: Observation, same: bool) -> None:
    assert (without_progress(other) == without_progress(observation())) is same


class Patches:
    def __init__(self) -> None:
        self.written: list[dict[str, Any]] = []

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        self.written.append(status)


async def test_the_writer_makes_no_status_while_only_the_progress_changed_and_is_not_due(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = []

    def counted(*args: Any) -> Any:
        made.append(args)
        return status_of(*args)

    monkeypatch.setattr(status_writer, "status_of", counted)
    api, clock = Patches(), FakeClock()
    writer = StatusWriter(cast(KubeApi, api), "ns", "job", clock)
    body: dict[str, Any] = {"metadata": {"generation": 1}}
    await writer.write(body, observation())
    for step in range(101, 105):
        clock.now += 1.0
        await writer.write(body, observation(progress=Progress(epoch=1, step=step)))
    assert (len(made), len(api.written)) == (1, 1), "the steps alone: nothing made or written"
    clock.now += 1.0
    await writer.write(body, observation(round=5, progress=Progress(epoch=1, step=105)))
    assert len(api.written) == 2 and api.written[-1]["progress"]["step"] == 105, "at once"
    clock.now += PROGRESS_WRITE_INTERVAL_S
    await writer.write(body, observation(round=5, progress=Progress(epoch=1, step=200)))
    assert api.written[-1]["progress"]["step"] == 200, "the progress, once due"
    body["metadata"]["generation"] = 2
    clock.now += 1.0
    await writer.write(body, observation(round=5, progress=Progress(epoch=1, step=201)))
    assert api.written[-1]["observedGeneration"] == 2, "a new generation is written at once"
