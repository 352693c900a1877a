"""The operator's metrics as Prometheus parses them: histograms fed by the drivers' observers,
and per-job values read from the controllers at each scrape."""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from elasticjob.driver.goodput import LostTime, on_failure, on_first_step
from elasticjob.driver.slot_assignment import assign_slots
from elasticjob.driver.stragglers import Straggler
from elasticjob.operator.api import Phase
from elasticjob.operator.controller import JobController
from elasticjob.operator.metrics import OperatorMetrics
from elasticjob.rendezvous.stats import RequestStats
from elasticjob.wire.messages import ProgressRequest, WorkerId
from tests.support.metrics_stubs import StubController, snapshot


def scrape(metrics: OperatorMetrics) -> list[Sample]:
    text = metrics.render().decode()
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def value(samples: Iterable[Sample], name: str, **labels: str) -> float:
    found = [s.value for s in samples if s.name == name and s.labels == labels]
    assert len(found) == 1, f"{name}{labels}: {found}"
    return found[0]


def make(controllers: list[StubController], stats: RequestStats) -> OperatorMetrics:
    return OperatorMetrics(lambda: cast(list[JobController], controllers), lambda: stats)


def test_histograms_hold_what_the_drivers_observed_and_are_dropped_with_their_job() -> None:
    metrics = make([], RequestStats())
    observer = metrics.job_observer("ns.a")
    for seconds in (0.4, 0.7, 3.0):
        observer.recovered(seconds)
    observer.round_formed(0.2)
    observer.committed(0.003)
    observer.checkpointed(0.8)
    observer.checkpointed(12.0)
    observer.health_checked(4.0, passed=True)
    observer.health_checked(3.0, passed=True)
    observer.health_checked(40.0, passed=False)
    samples = scrape(metrics)
    recovery = "elasticjob_recovery_seconds"
    assert value(samples, f"{recovery}_count", job="ns.a") == 3
    assert value(samples, f"{recovery}_sum", job="ns.a") == pytest.approx(4.1)
    assert value(samples, f"{recovery}_bucket", job="ns.a", le="0.5") == 1
    assert value(samples, f"{recovery}_bucket", job="ns.a", le="1.0") == 2
    assert value(samples, f"{recovery}_bucket", job="ns.a", le="+Inf") == 3
    assert value(samples, "elasticjob_round_formation_seconds_count", job="ns.a") == 1
    assert value(samples, "elasticjob_commit_seconds_bucket", job="ns.a", le="0.005") == 1
    checkpoint = "elasticjob_checkpoint_seconds"
    assert value(samples, f"{checkpoint}_bucket", job="ns.a", le="1.0") == 1
    assert value(samples, f"{checkpoint}_bucket", job="ns.a", le="30.0") == 2
    assert value(samples, f"{checkpoint}_sum", job="ns.a") == pytest.approx(12.8)
    health = "elasticjob_health_check_seconds"
    assert value(samples, f"{health}_count", job="ns.a", result="passed") == 2
    assert value(samples, f"{health}_count", job="ns.a", result="failed") == 1
    assert value(samples, f"{health}_bucket", job="ns.a", result="passed", le="5.0") == 2
    metrics.forget("ns.a")
    metrics.forget("ns.a")
    assert not [s for s in scrape(metrics) if s.labels.get("job") == "ns.a"]


def test_per_job_values_are_read_at_each_scrape() -> None:
    lost, _ = on_first_step(LostTime.start(0.0), 10.0)
    lost = on_failure(lost, 60.0)
    job = snapshot(
        now=80.0,
        slots=dict(assign_slots([("a", 1), ("b", 1)], min_np=1, max_np=None)),
        progress=ProgressRequest(round=1, epoch=2, step=30, samples_per_second=512.0),
        lost_time=lost,
        reset_count=1,
        stragglers={
            WorkerId("b", 0): Straggler(since=70.0, slowdown=2.5, flagged=True),
            WorkerId("a", 0): Straggler(since=79.0, slowdown=1.6, flagged=False),
        },
        stragglers_found=3,
    )
    controllers = [
        StubController("ns.a", pods_created=3, pods_deleted=1, job=job),
        StubController("ns.b", phase=Phase.CREATED),
        StubController("ns.c", phase=Phase.SUSPENDED, suspensions=2),
    ]
    samples = scrape(make(controllers, RequestStats()))
    assert value(samples, "elasticjob_jobs", phase="Running") == 1
    assert value(samples, "elasticjob_jobs", phase="Created") == 1
    assert value(samples, "elasticjob_jobs", phase="Suspended") == 1
    assert value(samples, "elasticjob_suspensions_total", job="ns.c") == 2
    assert value(samples, "elasticjob_world_size", job="ns.a") == 2
    assert value(samples, "elasticjob_samples_per_second", job="ns.a") == 512.0
    # 10 s startup, 50 s rolled back (no commit since the first step), 20 s recovering
    assert value(samples, "elasticjob_goodput_ratio", job="ns.a") == pytest.approx(0.0)
    assert value(samples, "elasticjob_lost_seconds_total", job="ns.a", cause="rollback") == 50
    assert value(samples, "elasticjob_lost_seconds_total", job="ns.a", cause="recovery") == 20
    assert value(samples, "elasticjob_resets_total", job="ns.a") == 1
    assert value(samples, "elasticjob_stragglers", job="ns.a") == 1, "flagged ones only"
    assert value(samples, "elasticjob_stragglers_found_total", job="ns.a") == 3
    assert value(samples, "elasticjob_pods_created_total", job="ns.a") == 3
    assert value(samples, "elasticjob_pods_deleted_total", job="ns.b") == 0
    world_sizes = [s.labels["job"] for s in samples if s.name == "elasticjob_world_size"]
    assert world_sizes == ["ns.a"], "a job without a driver has no world size"


def test_rendezvous_latency_leaves_out_long_polls() -> None:
    stats = RequestStats()
    route = "GET /v1/jobs/{job}/notices"
    stats.record(route, 200, 0.002)
    stats.record(route, 200, 0.2)
    stats.record(route, 200, 30.0, long_poll=True)
    stats.record(route, 401, 0.0005)
    samples = scrape(make([], stats))
    latency = "elasticjob_rendezvous_request_seconds"
    assert value(samples, "elasticjob_rendezvous_requests_total", route=route, code="200") == 3
    assert value(samples, "elasticjob_rendezvous_requests_total", route=route, code="401") == 1
    assert value(samples, f"{latency}_count", route=route) == 3
    assert value(samples, f"{latency}_sum", route=route) == pytest.approx(0.2025)
    assert value(samples, f"{latency}_bucket", route=route, le="0.001") == 1
    assert value(samples, f"{latency}_bucket", route=route, le="0.0025") == 2
    assert value(samples, f"{latency}_bucket", route=route, le="+Inf") == 3


def test_a_replica_says_whether_it_leads_and_how_often_it_came_to_lead() -> None:
    metrics = make([], RequestStats())
    assert value(scrape(metrics), "elasticjob_operator_leader") == 0
    for leading in (True, False, True):
        metrics.set_leading(leading)
    samples = scrape(metrics)
    assert value(samples, "elasticjob_operator_leader") == 1
    assert value(samples, "elasticjob_operator_leadership_acquired_total") == 2
