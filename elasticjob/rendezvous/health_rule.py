"""The health check's decisions, as values: when a cohort stops gathering
(:func:`decide_gather`) and what each of its members' verdict is (:func:`judge_cohort`).

A pod passes when its check ran and its compute and copy figures reach ``min_relative`` of
the (lower) median of its peers' on the same kind of device: the cohort's other members, and the
figures of the job's pods that passed before it once the job holds :data:`MIN_HISTORY` of them
(with fewer, a median over so few would let one pod set the bar: the pod is compared within its
cohort only). Figures a pod reports have caps (``elasticjob.wire.health``), and a passed pod's
figures join the job's history only when its cohort measured at least two pods and they lie
within :data:`OUTLIER_FACTOR` of the median they were compared with (:func:`kept_as_peers`):
one broken benchmark, or one pod that lies about itself, cannot set the bar for every later
pod. A pod fails when it did not report in time, when a
micro-benchmark broke, or when it falls below its peers. A broken collective blames no one
by itself: a member whose collective failed while another member failed otherwise (it never
reported, or its benchmark broke) is excused and checks again in a new cohort; when every
member's collective failed, all check again, up to ``max_attempts`` cohorts each, and then
fail (two pods alone with a bad link between them cannot be told apart).
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
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
MIN_HISTORY: Final = 2
"""How many earlier pods' figures (on one kind of device) a job must hold before a new pod is
compared with them; with fewer, a pod is compared within its cohort only. Two: the first
cohort of the smallest job that checks its pods, each figure admitted by the rules of
:func:`kept_as_peers`, so that a replacement that starts alone is compared with them."""
OUTLIER_FACTOR: Final = 4.0
"""A passed pod's figures join the job's history only within this factor of the median they
were compared with, above or below."""


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


def _same_device(own: HealthFigures, figures: Iterable[HealthFigures]) -> list[HealthFigures]:
    return [f for f in figures if f.device == own.device]


def _peers(
    own: HealthFigures, cohort: Sequence[HealthFigures], history: Sequence[HealthFigures]
) -> list[HealthFigures]:
    """Whom ``own`` is compared with: its cohort's others on the same device kind, and the
    job's history on that kind once it holds :data:`MIN_HISTORY` figures."""
    earlier = _same_device(own, history)
    return _same_device(own, cohort) + (earlier if len(earlier) >= MIN_HISTORY else [])


def _ratios(own: HealthFigures, peers: Sequence[HealthFigures]) -> list[tuple[str, float, float]]:
    """Per figure: its name, ``own``'s value and the lower median of ``peers``' (not empty):
    of an even count, the lower middle value, so that one peer's high figure cannot raise
    the bar (a bar too high fails honest pods; one too low only lets a slow pod in)."""
    return [
        (
            name,
            float(getattr(own, field)),
            statistics.median_low(float(getattr(p, field)) for p in peers),
        )
        for name, field, _ in _FIGURES
    ]


def _relative(
    own: HealthFigures, peers: Sequence[HealthFigures], min_relative: float
) -> HealthVerdict:
    """Pass or fail ``own`` against the median of ``peers`` (same device kind)."""
    if not peers:
        return HealthVerdict(status=VerdictStatus.PASSED, reason="no peer to compare with")
    parts = []
    for (name, mine, median), (_, _, unit) in zip(_ratios(own, peers), _FIGURES, strict=True):
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
        status=VerdictStatus.PASSED, reason=f"{', '.join(parts)} of its {len(peers)} peers' median"
    )


def _measured_others(
    member: str, measured: Sequence[str], reports: Mapping[str, HealthReport]
) -> list[HealthFigures]:
    return [f for m in measured if m != member and (f := reports[m].figures) is not None]


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
        peers = _peers(own, _measured_others(member, measured, reports), history)
        verdicts[member] = _relative(own, peers, policy.min_relative)
    return verdicts


def kept_as_peers(
    reports: Mapping[str, HealthReport],
    verdicts: Mapping[str, HealthVerdict],
    history: Sequence[HealthFigures],
) -> list[HealthFigures]:
    """The figures of a judged cohort that join the job's history (see the module docstring):
    none from a cohort that measured fewer than two pods (a pod alone is compared with no one
    or with the history it would then tilt); of a passed pod, its figures when each lies within
    :data:`OUTLIER_FACTOR` of the median of the peers it was compared with."""
    measured = [m for m, report in reports.items() if report.figures is not None]
    if len(measured) < 2:
        return []
    kept = []
    for member in measured:
        own = reports[member].figures
        verdict = verdicts.get(member)
        if own is None or verdict is None or verdict.status is not VerdictStatus.PASSED:
            continue
        peers = _peers(own, _measured_others(member, measured, reports), history)
        if peers and all(
            1 / OUTLIER_FACTOR <= mine / median <= OUTLIER_FACTOR
            for _, mine, median in _ratios(own, peers)
        ):
            kept.append(own)
    return kept
