"""The ElasticJob's status as a pure function of an observation: pod counts, phase, Ready,
conditions and the model dumped by alias."""

from __future__ import annotations

import datetime

import pytest

from elasticjob.driver.driver_types import DriverPhase, JobResult
from elasticjob.driver.goodput import LostTime, on_commit, on_failure, on_first_step
from elasticjob.driver.job_state import JobState
from elasticjob.driver.slot_assignment import assign_slots
from elasticjob.driver.stragglers import Straggler
from elasticjob.operator.api import (
    ConditionStatus,
    ConditionType,
    ElasticJobStatus,
    Phase,
    WorkerStatus,
    parse_spec,
)
from elasticjob.operator.pods import PodState, PodView
from elasticjob.operator.status_observation import (
    Observation,
    PodCounts,
    goodput_of,
    observe,
    pod_counts,
)
from elasticjob.operator.status_render import phase_of, ready_of, status_of
from elasticjob.wire.messages import WorkerId
from tests.support.crd_model import good_spec
from tests.support.metrics_stubs import snapshot
from tests.support.observations import T0, T1, obs


def pod(name: str, state: PodState, unschedulable: str | None = None) -> PodView:
    return PodView(name, state, None, None, "", unschedulable=unschedulable)


@pytest.mark.parametrize(
    ("pods", "leaving", "expected"),
    [
        ([], set(), PodCounts()),
        (
            [pod("a", PodState.RUNNING), pod("b", PodState.RUNNING), pod("c", PodState.PENDING)],
            set(),
            PodCounts(live=2, pending=1),
        ),
        (
            [pod("a", PodState.RUNNING), pod("b", PodState.RUNNING), pod("c", PodState.LEAVING)],
            {"b", "c", "gone"},
            PodCounts(live=1, leaving=3),
        ),
        (
            [
                pod("a", PodState.PENDING, "0/3 nodes are available: 3 Insufficient cpu."),
                pod("b", PodState.PENDING, "0/3 nodes are available: 1 node(s) had taint."),
                pod("c", PodState.PENDING),
            ],
            set(),
            PodCounts(
                pending=3,
                unschedulable=2,
                scheduler_message="0/3 nodes are available: 1 node(s) had taint.",
            ),
        ),
        ([pod("a", PodState.FAILED), pod("b", PodState.SUCCEEDED)], set(), PodCounts()),
    ],
    ids=["none", "live-and-pending", "leaving", "unschedulable", "ended"],
)
def test_pod_counts(pods: list[PodView], leaving: set[str], expected: PodCounts) -> None:
    assert pod_counts({p.name: p for p in pods}, leaving) == expected


SUSPENDED = JobResult(False, "suspended: the 3 workers of round 4 stopped", 4, 1, suspended=True)
UNSCHEDULABLE = PodCounts(live=2, pending=1, unschedulable=1, scheduler_message="0/3 nodes fit")


@pytest.mark.parametrize(
    ("observation", "phase", "reason"),
    [
        (obs(invalid_spec="spec.minReplicas: bad"), Phase.FAILED, "InvalidSpec"),
        (obs(result=JobResult(True, "done", 4, 0)), Phase.SUCCEEDED, "TrainingFinished"),
        (obs(result=JobResult(False, "boom", 4, 1)), Phase.FAILED, "JobFailed"),
        (
            obs(result=JobResult(False, "too long", 4, 1, deadline_exceeded=True)),
            Phase.FAILED,
            "DeadlineExceeded",
        ),
        (obs(result=SUSPENDED), Phase.SUSPENDED, "Suspended"),
        (obs(driver_phase=DriverPhase.STARTING, round=0), Phase.CREATED, "Starting"),
        (
            obs(driver_phase=DriverPhase.STARTING, round=0, pods=UNSCHEDULABLE),
            Phase.CREATED,
            "Unschedulable",
        ),
        (obs(driver_phase=DriverPhase.FORMING, recovering=True), Phase.RECOVERING, "WorkerFailed"),
        (obs(driver_phase=DriverPhase.FORMING), Phase.SCALING, "Rendezvous"),
        (obs(pods=PodCounts(live=2, pending=1)), Phase.SCALING, "Scaling"),
        (obs(pods=PodCounts(live=3, leaving=1)), Phase.SCALING, "Scaling"),
        (obs(pods=UNSCHEDULABLE), Phase.DEGRADED, "Unschedulable"),
        (obs(pods=PodCounts(live=2)), Phase.DEGRADED, "FewerWorkers"),
        (obs(), Phase.RUNNING, "Training"),
    ],
    ids=[
        "invalid",
        "succeeded",
        "failed",
        "deadline-exceeded",
        "suspended",
        "starting",
        "starting-unschedulable",
        "recovering",
        "rendezvous",
        "pending",
        "leaving",
        "unschedulable",
        "fewer",
        "training",
    ],
)
def test_phase_of(observation: Observation, phase: Phase, reason: str) -> None:
    got_phase, got_reason, message = phase_of(observation)
    assert (got_phase, got_reason) == (phase, reason)
    assert message
    if reason == "Unschedulable":
        assert message == "1 worker pod(s) cannot be scheduled: 0/3 nodes fit"


@pytest.mark.parametrize(
    ("observation", "ready", "reason"),
    [
        (obs(invalid_spec="bad"), False, "InvalidSpec"),
        (obs(result=JobResult(True, "done", 4, 0)), False, "JobFinished"),
        (obs(result=SUSPENDED), False, "Suspended"),
        (obs(driver_phase=DriverPhase.STARTING, round=0), False, "Starting"),
        (obs(driver_phase=DriverPhase.FORMING, recovering=True), False, "WorkerFailed"),
        (obs(training_pods=1), False, "FewerWorkers"),
        (obs(), True, "Training"),
        (obs(driver_phase=DriverPhase.FORMING), True, "Training"),  # a scale-out's rendezvous
        (obs(pods=PodCounts(live=3, pending=2), desired=5), True, "Training"),
        (obs(pods=PodCounts(live=2), training_pods=2), True, "Training"),
    ],
    ids=[
        "invalid",
        "finished",
        "suspended",
        "starting",
        "recovering",
        "below-min",
        "training",
        "scale-out-rendezvous",
        "scale-out-pending",
        "degraded-at-min",
    ],
)
def test_ready_of(observation: Observation, ready: bool, reason: str) -> None:
    assert ready_of(observation)[:2] == (ready, reason)


def conditions_of(status: ElasticJobStatus) -> dict[ConditionType, tuple[ConditionStatus, str]]:
    return {c.type: (c.status, c.reason or "") for c in status.conditions}


def test_status_of_a_training_job() -> None:
    observation = obs(workers=[WorkerStatus(pod="a", node="n1", ranks=[0])])
    status = status_of(observation, ElasticJobStatus(), "sel", 7, T0)
    assert status.phase is Phase.RUNNING
    assert status.observed_generation == 7
    assert all(c.observed_generation == 7 for c in status.conditions)
    assert conditions_of(status) == {
        ConditionType.CREATED: (ConditionStatus.TRUE, ""),
        ConditionType.RUNNING: (ConditionStatus.TRUE, "Training"),
        ConditionType.SCALING: (ConditionStatus.FALSE, ""),
        ConditionType.RECOVERING: (ConditionStatus.FALSE, ""),
        ConditionType.DEGRADED: (ConditionStatus.FALSE, ""),
        ConditionType.SUCCEEDED: (ConditionStatus.FALSE, ""),
        ConditionType.FAILED: (ConditionStatus.FALSE, ""),
        ConditionType.READY: (ConditionStatus.TRUE, "Training"),
    }
    dumped = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert dumped == {
        "phase": "Running",
        "observedGeneration": 7,
        "conditions": dumped["conditions"],
        "replicas": 3,
        "selector": "sel",
        "round": 4,
        "noticeSeq": 9,
        "worldSize": 3,
        "workers": [{"pod": "a", "node": "n1", "ranks": [0]}],
        "stragglers": [],
        "blacklistedNodes": [],
        "resetCount": 0,
        "restartCount": 0,
        "startTime": "2026-01-01T12:00:00Z",
        "history": [],
    }
    ready = next(c for c in dumped["conditions"] if c["type"] == "Ready")
    assert ready == {
        "type": "Ready",
        "status": "True",
        "reason": "Training",
        "message": "training with at least minReplicas (2) worker pods",
        "lastTransitionTime": "2026-01-01T12:00:00Z",
        "observedGeneration": 7,
    }
    assert ElasticJobStatus.model_validate(dumped) == status


def test_ready_does_not_flap_through_a_scale_out() -> None:
    first = status_of(obs(), ElasticJobStatus(), "sel", 1, T0)
    scaling = status_of(obs(desired=5, pods=PodCounts(live=3, pending=2)), first, "sel", 2, T1)
    forming = status_of(
        obs(driver_phase=DriverPhase.FORMING, desired=5, pods=PodCounts(live=5)),
        scaling,
        "sel",
        2,
        T1 + datetime.timedelta(seconds=5),
    )
    for status in (scaling, forming):
        ready = next(c for c in status.conditions if c.type is ConditionType.READY)
        assert ready.status is ConditionStatus.TRUE
        assert ready.last_transition_time == T0
    assert scaling.phase is Phase.SCALING
    running = next(c for c in scaling.conditions if c.type is ConditionType.RUNNING)
    assert (running.status, running.reason, running.last_transition_time) == (
        ConditionStatus.FALSE,
        "Training",  # the last reason it held for
        T1,
    )


def test_unschedulable_pods_are_named_with_the_schedulers_message() -> None:
    status = status_of(obs(pods=UNSCHEDULABLE), ElasticJobStatus(), "sel", 1, T0)
    degraded = next(c for c in status.conditions if c.type is ConditionType.DEGRADED)
    assert (degraded.status, degraded.reason, degraded.message) == (
        ConditionStatus.TRUE,
        "Unschedulable",
        "1 worker pod(s) cannot be scheduled: 0/3 nodes fit",
    )
    assert status.phase is Phase.DEGRADED


def test_a_clamp_is_a_condition_until_it_is_resolved() -> None:
    clamped = status_of(
        obs(replicas_clamped="spec.replicas 9 is outside [2, 5]; running 5 worker pods"),
        ElasticJobStatus(),
        "sel",
        3,
        T0,
    )
    assert conditions_of(clamped)[ConditionType.REPLICAS_CLAMPED] == (
        ConditionStatus.TRUE,
        "ReplicasOutOfRange",
    )
    assert clamped.phase is Phase.RUNNING
    resolved = status_of(obs(), clamped, "sel", 4, T1)
    assert conditions_of(resolved)[ConditionType.REPLICAS_CLAMPED] == (
        ConditionStatus.FALSE,
        "ReplicasInRange",
    )
    never = status_of(obs(), ElasticJobStatus(), "sel", 1, T0)
    assert ConditionType.REPLICAS_CLAMPED not in conditions_of(never)


def test_a_suspension_is_a_condition_that_stays_false_once_resumed() -> None:
    suspended = status_of(obs(result=SUSPENDED), ElasticJobStatus(), "sel", 3, T0)
    assert suspended.phase is Phase.SUSPENDED and suspended.completion_time is None
    assert conditions_of(suspended)[ConditionType.SUSPENDED] == (
        ConditionStatus.TRUE,
        "Suspended",
    )
    assert conditions_of(suspended)[ConditionType.RUNNING][0] is ConditionStatus.FALSE
    resumed = status_of(obs(driver_phase=DriverPhase.STARTING), suspended, "sel", 4, T1)
    assert resumed.phase is Phase.CREATED
    assert conditions_of(resumed)[ConditionType.SUSPENDED] == (ConditionStatus.FALSE, "Resumed")
    never = status_of(obs(), ElasticJobStatus(), "sel", 1, T0)
    assert ConditionType.SUSPENDED not in conditions_of(never)


def test_a_job_suspended_before_it_ran_keeps_its_recorded_counts() -> None:
    state = JobState(last_round=4, resets=2, restarts=1, last_reset_reason="x")
    spec = parse_spec(good_spec())
    previous = ElasticJobStatus(round=4)
    status = status_of(Observation.suspended("queued", spec, state), previous, "sel", 1, T0)
    assert status.phase is Phase.SUSPENDED
    assert (status.round, status.reset_count, status.restart_count) == (4, 2, 1)
    assert status.last_reset_reason == "x" and not status.workers


def test_an_invalid_spec_fails_the_job_with_a_condition() -> None:
    status = status_of(
        Observation.refused("spec.minReplicas: too big"), ElasticJobStatus(), "s", 1, T0
    )
    assert status.phase is Phase.FAILED
    assert status.completion_time == T0
    invalid = next(c for c in status.conditions if c.type is ConditionType.INVALID_SPEC)
    assert (invalid.status, invalid.message) == (ConditionStatus.TRUE, "spec.minReplicas: too big")


def test_times_and_progress_carry_over() -> None:
    previous = ElasticJobStatus.model_validate(
        {"startTime": "2025-12-31T00:00:00Z", "progress": {"epoch": 2, "step": 5}}
    )
    status = status_of(obs(), previous, "sel", 1, T0)
    assert status.start_time == datetime.datetime(2025, 12, 31, tzinfo=datetime.UTC)
    assert status.progress is not None and status.progress.epoch == 2
    assert status.completion_time is None
    done = status_of(obs(result=JobResult(True, "done", 4, 0)), status, "sel", 1, T1)
    assert done.completion_time == T1


def test_goodput_in_the_status_says_where_the_time_went() -> None:
    lost, _ = on_first_step(LostTime.start(0.0), 4.0)
    lost = on_failure(on_commit(lost, 20.0), 30.0)
    lost, _ = on_first_step(lost, 31.5)
    goodput = goodput_of(lost, 40.0)
    assert goodput.ratio == pytest.approx(1 - (4.0 + 10.0 + 1.5) / 40.0)
    assert goodput.lost_seconds.model_dump() == {
        "startup": 4.0,
        "recovery": 1.5,
        "rollback": 10.0,
        "resize": 0.0,
    }
    assert goodput.last_recovery_seconds == 1.5
    written = goodput.model_dump(by_alias=True)
    assert written["lastRecoverySeconds"] == 1.5 and "lostSeconds" in written


def test_the_status_keeps_the_goodput_it_had_while_there_is_no_newer() -> None:
    before = status_of(
        obs(goodput=goodput_of(LostTime.start(0.0), 5.0)), ElasticJobStatus(), "sel", 1, T0
    )
    assert before.goodput is not None and before.goodput.ratio == 0.0
    after = status_of(obs(), before, "sel", 1, T1)
    assert after.goodput == before.goodput


def test_the_status_names_the_slow_workers_of_the_round_by_rank() -> None:
    slots = dict(assign_slots([("p-a", 1), ("p-b", 1), ("p-c", 1)], min_np=1, max_np=None))
    job = snapshot(
        slots=slots,
        stragglers={
            WorkerId("p-c", 0): Straggler(since=1.0, slowdown=2.5, flagged=True),
            WorkerId("p-b", 0): Straggler(since=9.0, slowdown=1.6, flagged=False),
            WorkerId("gone", 0): Straggler(since=1.0, slowdown=3.0, flagged=True),
        },
    )
    observed = observe(job, parse_spec(good_spec()), {}, (), (), None)
    assert [s.model_dump() for s in observed.stragglers] == [
        {"pod": "p-b", "rank": 1, "slowdown": 1.6, "flagged": False},
        {"pod": "p-c", "rank": 2, "slowdown": 2.5, "flagged": True},
    ]


def test_the_status_tells_the_jobs_story_and_keeps_it_when_nothing_new_is_told() -> None:
    story = ["2026-11-18T11:06:40Z round 1 formed: 2 workers (2 joined, 0 left)"]
    told = status_of(obs(history=story), ElasticJobStatus(), "sel", 1, T0)
    assert told.history == story
    assert told.model_dump(by_alias=True)["history"] == story
    kept = status_of(obs(result=SUSPENDED), told, "sel", 1, T1)
    assert kept.history == story
