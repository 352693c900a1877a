"""The operator's metrics in the Prometheus text format."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

from elasticjob.operator.api import Phase
from elasticjob.rendezvous.stats import RequestStats

if TYPE_CHECKING:
    from elasticjob.operator.controller import JobController


def _labels(**labels: str) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return "{" + inner + "}" if inner else ""


def render_metrics(controllers: Iterable[JobController], stats: RequestStats) -> str:
    """Jobs by phase, resets, recovery time, pods created and deleted, rendezvous requests
    and latency."""
    controllers = list(controllers)
    lines: list[str] = []

    def metric(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{labels} {value:g}" for labels, value in samples)

    phases = Counter(c.phase for c in controllers)
    metric(
        "elasticjob_jobs",
        "gauge",
        "Jobs this operator runs, by phase.",
        [(_labels(phase=p.value), phases.get(p, 0)) for p in Phase],
    )
    jobs = [(c, _labels(job=c.job_id)) for c in controllers]
    metric(
        "elasticjob_resets_total",
        "counter",
        "Resets (failure recoveries and resizes).",
        [(lbl, c.driver.registry.reset_count if c.driver else 0) for c, lbl in jobs],
    )
    metric(
        "elasticjob_recovery_seconds_sum",
        "counter",
        "Seconds from a worker failure to the next round, summed.",
        [(lbl, c.driver.recovery_seconds_sum if c.driver else 0.0) for c, lbl in jobs],
    )
    metric(
        "elasticjob_recovery_seconds_count",
        "counter",
        "Recoveries from worker failures.",
        [(lbl, c.driver.recoveries if c.driver else 0) for c, lbl in jobs],
    )
    metric(
        "elasticjob_pods_created_total",
        "counter",
        "Worker pods created.",
        [(lbl, c.pods_created) for c, lbl in jobs],
    )
    metric(
        "elasticjob_pods_deleted_total",
        "counter",
        "Worker pods deleted.",
        [(lbl, c.pods_deleted) for c, lbl in jobs],
    )
    routes = stats.snapshot()
    metric(
        "elasticjob_rendezvous_requests_total",
        "counter",
        "Rendezvous requests.",
        [
            (_labels(route=r, code=str(code)), n)
            for r, s in sorted(routes.items())
            for code, n in sorted(s.by_status.items())
        ],
    )
    metric(
        "elasticjob_rendezvous_request_seconds_sum",
        "counter",
        "Rendezvous request latency, summed (long-polls included).",
        [(_labels(route=r), s.latency_seconds_sum) for r, s in sorted(routes.items())],
    )
    metric(
        "elasticjob_rendezvous_request_seconds_count",
        "counter",
        "Rendezvous requests timed.",
        [(_labels(route=r), s.requests) for r, s in sorted(routes.items())],
    )
    return "\n".join(lines) + "\n"
