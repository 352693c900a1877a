"""The kopf handlers run on the operator's event loop (where the controllers live), and the job
supervisor runs one controller task per ElasticJob the way the handlers feed it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import Any

import kopf
import pytest
from kopf._core.actions.invocation import invoke  # how kopf calls a handler

from elasticjob.operator import handlers
from elasticjob.operator.controller import JobController
from elasticjob.operator.kube import KubeApi
from elasticjob.operator.operator_config import OperatorConfig
from elasticjob.operator.operator_process import OperatorRuntime
from elasticjob.operator.supervisor import JobSupervisor, StopSignal
from elasticjob.rendezvous.server import RendezvousService

DEADLINE = 5.0


class ThreadRecordingController(JobController):
    """A real controller that remembers which thread delivered each pod event."""

    threads: list[int]

    def on_pod_event(self, event_type: str, pod: Mapping[str, Any]) -> None:
        self.threads.append(threading.get_ident())
        super().on_pod_event(event_type, pod)


class ThreadRecordingSet(set[str]):
    threads: list[int]

    def add(self, element: str) -> None:
        self.threads.append(threading.get_ident())
        super().add(element)


def pod(name: str, phase: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "labels": {"elasticjob.dev/job-name": "job", "elasticjob.dev/role": "worker"},
        },
        "status": {"phase": phase},
    }


async def test_a_pod_event_reaches_its_controller_on_the_event_loop() -> None:
    runtime = OperatorRuntime(OperatorConfig(rendezvous_url="http://127.0.0.1:1"))
    controller = ThreadRecordingController(
        "ns", "job", KubeApi(), RendezvousService(), runtime.controller_settings, set()
    )
    controller.threads = []
    runtime.controllers[("ns", "job")] = controller
    await invoke(
        handlers.pod_event,
        settings=kopf.OperatorSettings(),
        kwargs={
            "event": {"type": "MODIFIED"},
            "body": pod("job-w-1", "Failed"),
            "namespace": "ns",
            "memo": kopf.Memo(runtime=runtime),
        },
    )
    assert controller.threads == [threading.get_ident()], "the handler ran in another thread"


async def test_a_node_event_updates_the_not_ready_nodes_on_the_event_loop() -> None:
    runtime = OperatorRuntime(OperatorConfig(rendezvous_url="http://127.0.0.1:1"))
    recording = ThreadRecordingSet()
    recording.threads = []
    runtime.not_ready_nodes = recording
    node = {"metadata": {"name": "n1"}, "status": {"conditions": [{"type": "Ready"}]}}
    await invoke(
        handlers.node_event,
        settings=kopf.OperatorSettings(),
        kwargs={"event": {"type": "MODIFIED"}, "body": node, "memo": kopf.Memo(runtime=runtime)},
    )
    assert recording == {"n1"}
    assert recording.threads == [threading.get_ident()], "the handler ran in another thread"


async def test_the_cleanup_ends_every_wait_on_the_stop_flag() -> None:
    """A signal stops kopf without the stop flag; kopf then waits 5 s for its own task that
    waits on the flag (a pod deletion took 5 s longer): the cleanup sets it."""
    runtime = OperatorRuntime(OperatorConfig(rendezvous_url="http://127.0.0.1:1"))
    waiter = asyncio.create_task(runtime.stop_flag.wait(), name="stop-flag waiter")
    await invoke(
        handlers.stop, settings=kopf.OperatorSettings(), kwargs={"memo": kopf.Memo(runtime=runtime)}
    )
    await asyncio.wait_for(waiter, timeout=5)


# --- the job supervisor ------------------------------------------------------------------------


def job(uid: str = "u1", phase: str | None = None, deleting: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"uid": uid, "namespace": "ns", "name": f"job-{uid}"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": metadata, "spec": {"replicas": 1}, "status": {"phase": phase}}


class Runs:
    """A job runner whose behaviour each test scripts: it records its calls and the bodies it
    saw, and returns, raises or waits for ``stopped`` as told."""

    def __init__(self, *outcomes: str) -> None:
        self.outcomes = list(outcomes)
        self.calls: list[tuple[str, str]] = []
        self.bodies: list[Mapping[str, Any]] = []
        self.signals: list[StopSignal] = []
        self.called = asyncio.Event()
        self.cancelled = False

    async def __call__(
        self, namespace: str, name: str, body: Mapping[str, Any], stopped: StopSignal
    ) -> None:
        self.calls.append((namespace, name))
        self.signals.append(stopped)
        self.bodies.append(body)
        self.called.set()
        outcome = self.outcomes.pop(0) if self.outcomes else "return"
        if outcome == "raise":
            raise RuntimeError("the controller failed")
        if outcome == "until-stopped":
            await stopped.wait()
        if outcome == "ignore-stop":
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise

    async def next_call(self) -> None:
        await asyncio.wait_for(self.called.wait(), DEADLINE)
        self.called.clear()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_job_runs_once_and_sees_its_latest_version() -> None:
    runs = Runs("until-stopped")
    supervisor = JobSupervisor(runs)
    await supervisor.observe(None, job())
    await runs.next_call()
    updated = job()
    updated["spec"]["replicas"] = 4
    await supervisor.observe("MODIFIED", updated)
    await settle()
    assert runs.calls == [("ns", "job-u1")]
    assert runs.bodies[0]["spec"]["replicas"] == 4
    await supervisor.stop_all()


async def test_an_update_of_a_running_job_is_told_at_once() -> None:
    runs = Runs("until-stopped")
    told: list[tuple[str, str]] = []
    supervisor = JobSupervisor(runs, updated=lambda namespace, name: told.append((namespace, name)))
    await supervisor.observe(None, job())
    await runs.next_call()
    assert told == [], "a new job is started, not told"
    await supervisor.observe("MODIFIED", job())
    assert told == [("ns", "job-u1")]
    await supervisor.stop_all()


async def test_a_job_that_ended_is_not_restarted_until_it_is_deleted() -> None:
    runs = Runs("return")
    supervisor = JobSupervisor(runs)
    await supervisor.observe("ADDED", job())
    await runs.next_call()
    await supervisor.observe("MODIFIED", job())
    await settle()
    assert len(runs.calls) == 1


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
async def test_a_job_seen_after_it_ended_is_not_run(phase: str) -> None:
    runs = Runs()
    supervisor = JobSupervisor(runs)
    await supervisor.observe(None, job(phase=phase))
    await settle()
    assert runs.calls == []


async def test_a_failing_job_is_restarted_after_the_backoff() -> None:
    runs = Runs("raise", "until-stopped")
    supervisor = JobSupervisor(runs, backoff_s=0.01)
    await supervisor.observe(None, job())
    await runs.next_call()
    await runs.next_call()
    assert len(runs.calls) == 2
    await supervisor.stop_all()


@pytest.mark.parametrize(
    ("event", "body"),
    [("DELETED", job()), ("MODIFIED", job(deleting=True))],
    ids=["deleted", "being-deleted"],
)
async def test_deletion_stops_the_job(event: str, body: dict[str, Any]) -> None:
    runs = Runs("until-stopped", "until-stopped")
    supervisor = JobSupervisor(runs)
    await supervisor.observe(None, job())
    await runs.next_call()
    await asyncio.wait_for(supervisor.observe(event, body), DEADLINE)
    await supervisor.observe("ADDED", job(uid="u2"))  # a new job of the same name runs anew
    await runs.next_call()
    assert runs.calls == [("ns", "job-u1"), ("ns", "job-u2")]
    await supervisor.stop_all()


async def test_a_job_that_does_not_stop_is_cancelled() -> None:
    runs = Runs("ignore-stop")
    supervisor = JobSupervisor(runs, cancellation_timeout_s=0.05)
    await supervisor.observe(None, job())
    await runs.next_call()
    await asyncio.wait_for(supervisor.observe("DELETED", job()), DEADLINE)
    assert runs.cancelled


async def test_the_supervisor_puts_no_finalizer_on_jobs() -> None:
    """kopf adds its finalizer for daemons and deletion handlers: there are none."""
    registry = handlers.REGISTRY
    assert not registry._spawning.get_all_handlers()
    assert not [h for h in registry._changing.get_all_handlers() if h.requires_finalizer]


# --- the job supervisor of a replica that stands by or leads -----------------------------------


async def test_a_standby_runs_no_job_and_runs_them_all_once_it_leads() -> None:
    runs = Runs("until-stopped", "until-stopped")
    supervisor = JobSupervisor(runs, leading=False)
    await supervisor.observe(None, job())
    await supervisor.observe(None, job(uid="u2"))
    await supervisor.observe(None, job(uid="u3", phase="Succeeded"))
    await settle()
    assert runs.calls == [], "a standby never acts on a job"
    assert sorted(supervisor.unended()) == [("ns", "job-u1"), ("ns", "job-u2")]
    supervisor.lead()
    await runs.next_call()
    await settle()
    assert sorted(runs.calls) == [("ns", "job-u1"), ("ns", "job-u2")]
    await supervisor.stop_all()


async def test_standing_down_hands_every_job_over_and_leading_again_runs_them_anew() -> None:
    runs = Runs("until-stopped", "until-stopped")
    supervisor = JobSupervisor(runs)
    await supervisor.observe(None, job())
    await runs.next_call()
    await asyncio.wait_for(supervisor.stand_down(), DEADLINE)
    assert runs.signals[0].is_set() and runs.signals[0].handover, "the job goes on elsewhere"
    await supervisor.observe("MODIFIED", job())  # watched on, not run
    await settle()
    assert len(runs.calls) == 1
    supervisor.lead()
    await runs.next_call()
    assert runs.calls == [("ns", "job-u1")] * 2
    assert not runs.signals[1].is_set(), "a new run gets a signal of its own"
    await supervisor.stop_all()


async def test_a_lost_lease_cancels_the_jobs_at_once() -> None:
    runs = Runs("ignore-stop")
    supervisor = JobSupervisor(runs, cancellation_timeout_s=DEADLINE * 10)
    await supervisor.observe(None, job())
    await runs.next_call()
    await asyncio.wait_for(supervisor.stand_down(at_once=True), DEADLINE)
    assert runs.cancelled


async def test_a_job_that_ended_under_this_leader_is_not_run_again_when_it_leads_again() -> None:
    runs = Runs("return")
    supervisor = JobSupervisor(runs)
    await supervisor.observe(None, job())
    await runs.next_call()
    await settle()
    await supervisor.stand_down()
    supervisor.lead()
    await settle()
    assert len(runs.calls) == 1 and supervisor.unended() == []


async def test_deletion_is_not_a_handover() -> None:
    runs = Runs("until-stopped")
    supervisor = JobSupervisor(runs)
    await supervisor.observe(None, job())
    await runs.next_call()
    await asyncio.wait_for(supervisor.observe("DELETED", job()), DEADLINE)
    assert runs.signals[0].is_set() and not runs.signals[0].handover


async def test_a_stand_down_cut_short_leaves_the_job_to_the_next_stop() -> None:
    runs = Runs("ignore-stop")
    supervisor = JobSupervisor(runs, cancellation_timeout_s=DEADLINE * 10)
    await supervisor.observe(None, job())
    await runs.next_call()
    standing_down = asyncio.create_task(supervisor.stand_down())
    await settle()
    standing_down.cancel()  # the operator stopped meanwhile
    await asyncio.gather(standing_down, return_exceptions=True)
    supervisor.lead()
    await settle()
    assert len(runs.calls) == 1, "a task still running is not started twice"
    await asyncio.wait_for(supervisor.stand_down(at_once=True), DEADLINE)
    assert runs.cancelled, "the next stop found it"


async def test_a_stand_down_gives_the_jobs_its_grace_then_cancels() -> None:
    runs = Runs("ignore-stop")
    supervisor = JobSupervisor(runs, cancellation_timeout_s=DEADLINE * 10)
    await supervisor.observe(None, job())
    await runs.next_call()
    await asyncio.wait_for(supervisor.stand_down(grace_s=0.05), DEADLINE)
    assert runs.cancelled


def test_the_validation_webhooks_outlive_the_replica_that_exits() -> None:
    """kopf takes the webhooks that are not persistent out of the configuration when an
    operator exits: with a rolling upgrade, or one replica restarted, the replicas that stay
    would never register them again, and ElasticJobs would be admitted unchecked."""
    validating = [
        h
        for h in kopf.get_default_registry()._webhooks.get_all_handlers()
        if h.id.startswith("validate-")
    ]
    assert {h.id for h in validating} == {"validate-spec", "validate-scale"}
    assert all(h.persistent for h in validating)
