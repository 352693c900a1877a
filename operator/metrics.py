"""The operator's Prometheus metrics.

Two kinds: histograms fed as things happen (each job's driver tells its
:class:`JobObserver` the time to recover, round formation and commit durations) and values
read at every scrape from each job's snapshot (its one read model, through its controller)
and the rendezvous service's request stats
(:class:`_StateCollector`: jobs by phase, world size, samples/s, goodput, lost seconds,
resets, pods, rendezvous requests and their latency without long-polls). Besides, whether this
replica leads and how often it came to lead (set by ``leadership.py``).
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from elasticjob.operator.api import Phase
from elasticjob.rendezvous.stats import LATENCY_BUCKETS_S, RequestStats

if TYPE_CHECKING:
    from elasticjob.operator.controller import JobController

RECOVERY_BUCKETS_S: Final = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Buckets of the time to recover and of round formation."""
COMMIT_BUCKETS_S: Final = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
"""Buckets of commit durations."""
CHECKPOINT_BUCKETS_S: Final = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
"""Buckets of durable checkpoint durations (written to a volume, off the training thread)."""

HEALTH_CHECK_BUCKETS_S: Final = (1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
"""Buckets of new pods' health-check durations (the cohort's gathering included)."""

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
"""The exposition format :meth:`OperatorMetrics.render` writes."""


class JobObserver:
    """One job's driver observer (``elasticjob.driver.driver_types.DriverObserver``): puts what the
    driver measures into the operator's histograms, labelled with the job."""

    def __init__(self, metrics: OperatorMetrics, job: str) -> None:
        self._recovery = metrics.recovery.labels(job=job)
        self._formation = metrics.formation.labels(job=job)
        self._commit = metrics.commit.labels(job=job)
        self._checkpoint = metrics.checkpoint.labels(job=job)
        self._health = {
            passed: metrics.health_check.labels(job=job, result="passed" if passed else "failed")
            for passed in (True, False)
        }

    def round_formed(self, seconds: float) -> None:
        self._formation.observe(seconds)

    def recovered(self, seconds: float) -> None:
        self._recovery.observe(seconds)

    def committed(self, seconds: float) -> None:
        self._commit.observe(seconds)

    def checkpointed(self, seconds: float) -> None:
        self._checkpoint.observe(seconds)

    def health_checked(self, seconds: float, *, passed: bool) -> None:
        self._health[passed].observe(seconds)


class OperatorMetrics:
    """The operator's metrics registry; :meth:`render` writes what ``/metrics`` serves."""

    def __init__(
        self,
        controllers: Callable[[], Iterable[JobController]],
        stats: Callable[[], RequestStats],
    ) -> None:
        self.registry = CollectorRegistry()
        self.recovery = Histogram(
            "elasticjob_recovery_seconds",
            "Time to recover: from a failure to the moment training resumes in the next round.",
            ["job"],
            buckets=RECOVERY_BUCKETS_S,
            registry=self.registry,
        )
        self.formation = Histogram(
            "elasticjob_round_formation_seconds",
            "From the end (or failure) of a round, or the job's start, to the next round's "
            "publication.",
            ["job"],
            buckets=RECOVERY_BUCKETS_S,
            registry=self.registry,
        )
        self.commit = Histogram(
            "elasticjob_commit_seconds",
            "Duration of rank 0's commits (reported by the workers).",
            ["job"],
            buckets=COMMIT_BUCKETS_S,
            registry=self.registry,
        )
        self.checkpoint = Histogram(
            "elasticjob_checkpoint_seconds",
            "Duration of rank 0's durable checkpoints, written off the training thread "
            "(reported by the workers).",
            ["job"],
            buckets=CHECKPOINT_BUCKETS_S,
            registry=self.registry,
        )
        self.health_check = Histogram(
            "elasticjob_health_check_seconds",
            "Duration of new pods' health checks (spec.healthCheck), by result (passed or "
            "failed; the count of each is the number of checks).",
            ["job", "result"],
            buckets=HEALTH_CHECK_BUCKETS_S,
            registry=self.registry,
        )
        self.leader = Gauge(
            "elasticjob_operator_leader",
            "1 while this operator replica leads (acts on jobs and serves their rendezvous), "
            "0 while it stands by.",
            registry=self.registry,
        )
        self.leadership_acquired = Counter(
            "elasticjob_operator_leadership_acquired",
            "Times this operator replica came to lead.",
            registry=self.registry,
        )
        self.registry.register(_StateCollector(controllers, stats))

    def set_leading(self, leading: bool) -> None:
        """This replica came to lead (True) or stood down (False)."""
        self.leader.set(1 if leading else 0)
        if leading:
            self.leadership_acquired.inc()

    def job_observer(self, job: str) -> JobObserver:
        """The driver observer of ``job``."""
        return JobObserver(self, job)

    def forget(self, job: str) -> None:
        """Drop the histograms of ``job`` (it ended or was deleted)."""
        for histogram in (self.recovery, self.formation, self.commit, self.checkpoint):
            try:
                histogram.remove(job)
            except KeyError:
                continue
        for result in ("passed", "failed"):
            try:
                self.health_check.remove(job, result)
            except KeyError:
                continue

    def render(self) -> bytes:
        """Every metric in the Prometheus text format."""
        body: bytes = generate_latest(self.registry)
        return body


class _StateCollector(Collector):
    """Values read from the controllers and the rendezvous service at each scrape."""

    def __init__(
        self,
        controllers: Callable[[], Iterable[JobController]],
        stats: Callable[[], RequestStats],
    ) -> None:
        self._controllers = controllers
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        controllers = list(self._controllers())
        yield from _job_metrics(controllers)
        yield from _request_metrics(self._stats())


def _job_metrics(controllers: list[JobController]) -> Iterator[Metric]:
    phases = collections.Counter(c.phase for c in controllers)
    jobs = GaugeMetricFamily(
        "elasticjob_jobs",
        "Jobs this operator runs, by phase (Suspended among them).",
        labels=["phase"],
    )
    for phase in Phase:
        jobs.add_metric([phase.value], phases.get(phase, 0))
    yield jobs
    world = GaugeMetricFamily(
        "elasticjob_world_size", "Workers in the job's current round.", labels=["job"]
    )
    throughput = GaugeMetricFamily(
        "elasticjob_samples_per_second", "Samples per second rank 0 last reported.", labels=["job"]
    )
    goodput = GaugeMetricFamily(
        "elasticjob_goodput_ratio",
        "Share of the job's wall time spent in productive steps (not in startup, recovery, "
        "rolled-back training or resize pauses).",
        labels=["job"],
    )
    lost = CounterMetricFamily(
        "elasticjob_lost_seconds",
        "Wall time the job lost, by cause (startup, recovery, rollback, resize).",
        labels=["job", "cause"],
    )
    resets = CounterMetricFamily(
        "elasticjob_resets",
        "Resets (failure recoveries and resizes) since the job started.",
        labels=["job"],
    )
    created = CounterMetricFamily("elasticjob_pods_created", "Worker pods created.", labels=["job"])
    deleted = CounterMetricFamily("elasticjob_pods_deleted", "Worker pods deleted.", labels=["job"])
    stragglers = GaugeMetricFamily(
        "elasticjob_stragglers",
        "Workers of the current round flagged as stragglers (spec.stragglers).",
        labels=["job"],
    )
    stragglers_found = CounterMetricFamily(
        "elasticjob_stragglers_found",
        "Workers flagged as stragglers since this operator ran the job.",
        labels=["job"],
    )
    suspensions = CounterMetricFamily(
        "elasticjob_suspensions",
        "Times this operator saw the job suspended (spec.suspend).",
        labels=["job"],
    )
    for controller in controllers:
        job = [controller.job_id]
        created.add_metric(job, controller.pods_created)
        deleted.add_metric(job, controller.pods_deleted)
        suspensions.add_metric(job, controller.suspensions)
        snapshot = controller.snapshot()
        if snapshot is None:
            continue
        world.add_metric(job, snapshot.world_size)
        progress = snapshot.progress
        throughput.add_metric(job, progress.samples_per_second if progress else 0.0)
        goodput.add_metric(job, snapshot.goodput)
        for cause, seconds in snapshot.lost_time.lost_seconds(snapshot.now).items():
            lost.add_metric([controller.job_id, cause.value], seconds)
        resets.add_metric(job, snapshot.reset_count)
        stragglers.add_metric(job, sum(s.flagged for s in snapshot.stragglers.values()))
        stragglers_found.add_metric(job, snapshot.stragglers_found)
    yield from (world, throughput, goodput, lost, resets, created, deleted, suspensions)
    yield from (stragglers, stragglers_found)


def _request_metrics(stats: RequestStats) -> Iterator[Metric]:
    routes = sorted(stats.snapshot().items())
    requests = CounterMetricFamily(
        "elasticjob_rendezvous_requests", "Rendezvous requests.", labels=["route", "code"]
    )
    latency = HistogramMetricFamily(
        "elasticjob_rendezvous_request_seconds",
        "Rendezvous request latency, long-polls left out (a rendezvous or notices request "
        "that waits for news).",
        labels=["route"],
    )
    bounds = [str(b) for b in LATENCY_BUCKETS_S] + ["+Inf"]
    for route, route_stats in routes:
        for code, count in sorted(route_stats.by_status.items()):
            requests.add_metric([route, str(code)], count)
        cumulative = list(itertools.accumulate(route_stats.latency_buckets))
        latency.add_metric(
            [route], list(zip(bounds, cumulative, strict=True)), route_stats.latency_seconds_sum
        )
    yield requests
    yield latency
