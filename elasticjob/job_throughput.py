"""The throughput that a job's timeline draws: samples/s over windows of training time, from
the rates rank 0 reported (its job record, ``driver/job_record.py``).

A record holds no sample or step counts: each progress sample is the world size and the
samples/s that the training script measured over a stretch of its own choosing, stamped with
the time rank 0's report arrived. So the series is made of those rates, and the rules below
decide which of them describe training and which time they stand for:

- Windows tile each stretch of training (the time between two pauses: a startup, a recovery,
  a resize, a suspension) from its start, ``window_s`` long, the last one shorter: no window
  spans a pause, and reports made in a pause (the round the driver publishes carries the last
  rate, a fallback or a suspension drops it to 0) count for nothing.
- A report's rate stands for the time since the report before it in the same stretch; a
  window's rate is the time-weighted mean of the rates over the part of it they cover, so it
  always lies between the lowest and the highest rate reported in it: nothing is divided by
  the interval between two reports. A window that no rate covers is left out (a gap).
- The first report of a stretch whose rate differs from the last one reported before the
  stretch is left out: it is the script's first measurement after the pause, over an interval
  that may have begun before the stretch did (a timer kept across a rollback, an epoch's whole
  sample count divided by the part of it trained since a restart mid-epoch: the spike at a
  failure) or that holds the warm-up. Reports that repeat the rate from before the pause (the
  runtime re-sends its last rate with the resume and commit reports) stand as they are. A
  rate of 0 is no figure (the default of ``report_progress``).
- Replayed steps: the training that a failure threw away (from the last commit, or from the
  checkpoint a durable fallback loaded, to the failure; ``RecordEvent.rolled_back_from``)
  is drawn at the rate it ran at, in windows marked not :attr:`Window.kept`; the steps that
  train it again after the recovery are committed work and count like any other. That is
  where the goodput account puts the loss (``driver/goodput.py``: rollback), and the record
  knows exactly when the thrown-away training ran, where the replay's end would be a guess.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from elasticjob.driver.job_record import EventKind, JobRecordData, RecordSample

WINDOWS: Final = 200
"""About how many windows span a whole job (:func:`window_length`)."""
MIN_WINDOW_S: Final = 2.0
"""The shortest window (reports arrive at most once a second)."""


@dataclass(frozen=True)
class Window:
    """The throughput over ``[start, end)`` (wall time, seconds since the epoch)."""

    start: float
    end: float
    samples_per_second: float
    """The time-weighted mean of the rates that cover the window."""
    kept: bool = True
    """False: a rollback threw this training away, and the job trained it again later."""


def window_length(duration_s: float) -> float:
    """The window length for a job that ran ``duration_s``: about :data:`WINDOWS` windows
    span it, none shorter than :data:`MIN_WINDOW_S`."""
    return max(duration_s / WINDOWS, MIN_WINDOW_S)


def throughput(
    record: JobRecordData, pauses: Iterable[tuple[float, float]], window_s: float
) -> list[Window]:
    """The throughput windows of ``record`` in time order, given its ``pauses`` (the stretches
    without training, start and end) and the window length (see the module docstring)."""
    if window_s <= 0:
        raise ValueError(f"a window must last some time, not {window_s} s")
    reports = _in_order(record.samples)
    rolled_back = [
        (e.rolled_back_from, e.t)
        for e in record.events
        if e.kind is EventKind.RESUMED and e.rolled_back_from is not None
    ]
    windows: list[Window] = []
    for start, end in _training(pauses):
        before = [r.samples_per_second for r in reports if r.t <= start and r.samples_per_second]
        inside = [r for r in reports if start < r.t < end]
        covered = _covered(inside, start, before[-1] if before else None)
        if covered:
            windows += _windows(covered, start, window_s, rolled_back)
    return windows


def _in_order(samples: Sequence[RecordSample]) -> list[RecordSample]:
    """``samples`` by time; of several at the same time, the one recorded last."""
    latest = {sample.t: sample for sample in samples}
    return [latest[t] for t in sorted(latest)]


def _training(pauses: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The stretches of training around ``pauses``: open-ended before the first and after the
    last."""
    stretches: list[tuple[float, float]] = []
    since = -math.inf
    for start, end in sorted(pauses):
        if start > since:
            stretches.append((since, start))
        since = max(since, end)
    stretches.append((since, math.inf))
    return stretches


def _covered(
    reports: Sequence[RecordSample], start: float, rate_before: float | None
) -> list[tuple[float, float, float]]:
    """The (from, to, samples/s) that the reports of one stretch starting at ``start`` stand
    for, the first new measurement left out."""
    covered: list[tuple[float, float, float]] = []
    since = start if math.isfinite(start) else None
    measured = False
    for report in reports:
        rate = report.samples_per_second
        if not rate:
            continue
        if not measured and rate != rate_before:
            measured = True  # the script's first measurement: it began before the stretch
        elif since is not None:
            covered.append((since, report.t, rate))
        since = report.t
    return covered


def _windows(
    covered: Sequence[tuple[float, float, float]],
    start: float,
    window_s: float,
    rolled_back: Sequence[tuple[float, float]],
) -> list[Window]:
    """The windows of one stretch tiled from ``start`` (or its first covered time), also cut
    where thrown-away training begins and ends."""
    first, last = covered[0][0], covered[-1][1]
    origin = start if math.isfinite(start) else first
    count = math.ceil((last - origin) / window_s)
    cuts = {origin + n * window_s for n in range(count)} | {last}
    cuts |= {t for span in rolled_back for t in span if origin < t < last}
    edges = sorted(cuts)
    windows = []
    for a, b in itertools.pairwise(edges):
        weights = [(min(b, to) - max(a, since), rate) for since, to, rate in covered]
        seconds = sum(w for w, _ in weights if w > 0)
        if seconds > 0:
            rate = sum(w * r for w, r in weights if w > 0) / seconds
            kept = not any(f <= a and b <= t for f, t in rolled_back)
            windows.append(Window(a, b, rate, kept))
    return windows
