"""The health check's decisions, as values: when a cohort stops gathering
(:func:`decide_gather`) and what each of its members' verdict is (:func:`judge_cohort`).

A pod passes when its check ran and its compute and copy figures reach ``min_relative`` of
the median of its peers' (the cohort's other members and the pods of the job that passed
before it, on the same kind of device). A pod fails when it did not report in time, when a
micro-benchmark broke, or when it falls below its peers. A broken collective blames no one
by itself: a member whose collective failed while another member failed otherwise (it never
reported, or its benchmark broke) is excused and checks again in a new cohort; when every
member's collective failed, all check again, up to ``max_attempts`` cohorts each, and then
fail (two pods alone with a bad link between them cannot be told apart).
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from elasticjob.wire.health import (
    HealthFigures,
    HealthProblem,
    HealthReport,
    HealthVerdict,
    VerdictStatus,
)

DEFAULT_MIN_RELATIVE: Final = 0.5
DEFAULT_TIMEOUT_S: Final = 300.0
GATHER_S: Final = 5.0
"""Longest a cohort waits for the other pods expected to check, after its first member
asked."""
MAX_ATTEMPTS: Final = 3
PEERS_KEPT: Final = 16
"""How many passed pods' figures a job keeps as peers of later pods."""


@dataclass(frozen=True)
class HealthPolicy:
    """How a job checks its new pods (``spec.healthCheck``)."""

    min_relative: float = DEFAULT_MIN_RELATIVE
    """A pod whose compute or copy figure is below this fraction of its peers' median fails."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """A pod must be judged within this long of starting to run (the operator fails it
    then)."""
    gather_s: float = GATHER_S
    max_attempts: int = MAX_ATTEMPTS

    @property
    def cohort_s(self) -> float:
        """How long after it closed a cohort is judged, with or without every report: half of
        the timeout, so that a cohort is judged (a silent member failed, the others judged
        or excused) well before the operator's timeout fails its members' pods."""
        return self.timeout_s / 2


def decide_gather(
    still_expected: int, opened_at: float, now: float, gather_s: float
) -> float | None:
    """When the cohort being gathered closes: None, now (every pod expected to check has
    asked, or it gathered for ``gather_s``); else the time it closes at."""
    closes_at = opened_at + gather_s
    if still_expected <= 0 or now >= closes_at:
        return None
    return closes_at


_FIGURES: Final = (("compute", "compute_gflops", "GFLOP/s"), ("copy", "copy_gbps", "GB/s"))


def _relative(
    own: HealthFigures, peers: Sequence[HealthFigures], min_relative: float
) -> HealthVerdict:
    """Pass or fail ``own`` against the median of ``peers`` on the same device kind."""
    same = [p for p in peers if p.device == own.device]
    if not same:
        return HealthVerdict(status=VerdictStatus.PASSED, reason="no peer to compare with")
    parts = []
    for name, field, unit in _FIGURES:
        mine = float(getattr(own, field))
        median = statistics.median(float(getattr(p, field)) for p in same)
        ratio = mine / median
        if ratio < min_relative:
            return HealthVerdict(
                status=VerdictStatus.FAILED,
                reason=(
                    f"{name} {ratio:.2f}x of its peers' median ({mine:.3g} vs "
                    f"{median:.3g} {unit}; at least {min_relative:g}x required)"
                ),
            )
        parts.append(f"{name} {ratio:.2f}x")
    return HealthVerdict(
        status=VerdictStatus.PASSED, reason=f"{', '.join(parts)} of its {len(same)} peers' median"
    )


def judge_cohort(
    members: Sequence[str],
    reports: Mapping[str, HealthReport],
    history: Sequence[HealthFigures],
    attempts: Mapping[str, int],
    policy: HealthPolicy,
    *,
    gone: Collection[str] = (),
) -> dict[str, HealthVerdict]:
    """Every member's verdict, once the cohort is complete (every member reported, is
    ``gone``, or its time is up): see the module docstring. ``history``: the figures of
    the job's pods that passed before; ``attempts``: the cohorts each member was in, this
    one included."""
    verdicts: dict[str, HealthVerdict] = {}
    blamed = False
    for member in members:
        report = reports.get(member)
        if report is None:
            why = "it is gone" if member in gone else f"not within {policy.timeout_s:g} s"
            verdicts[member] = HealthVerdict(
                status=VerdictStatus.FAILED, reason=f"no health report ({why})"
            )
            blamed = True
        elif report.problem is HealthProblem.BENCHMARK:
            verdicts[member] = HealthVerdict(
                status=VerdictStatus.FAILED, reason=f"a benchmark failed: {report.message}"
            )
            blamed = True
    collective_failed = [
        m for m in members if m in reports and reports[m].problem is HealthProblem.COLLECTIVE
    ]
    measured = [m for m in members if m in reports and reports[m].figures is not None]
    for member in collective_failed:
        message = reports[member].message
        if measured and not blamed:  # the others ran it through: this member broke it
            verdicts[member] = HealthVerdict(
                status=VerdictStatus.FAILED,
                reason=f"the collective failed on it alone: {message}",
            )
        elif not blamed and attempts.get(member, 1) >= policy.max_attempts:
            verdicts[member] = HealthVerdict(
                status=VerdictStatus.FAILED,
                reason=f"the collective failed in {policy.max_attempts} cohorts: {message}",
            )
        else:
            verdicts[member] = HealthVerdict(
                status=VerdictStatus.RETRY, reason=f"the cohort's collective failed: {message}"
            )
    for member in measured:
        own = reports[member].figures
        assert own is not None
        peers = [
            figures
            for other in measured
            if other != member and (figures := reports[other].figures) is not None
        ]
        verdicts[member] = _relative(own, [*peers, *history], policy.min_relative)
    return verdicts
