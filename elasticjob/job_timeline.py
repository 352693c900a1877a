"""The timeline picture of a job: world size and throughput over time with its events marked,
and a summary of where the time went. Drawn from a job record (``driver/job_record.py``) as a
PNG or a self-contained HTML page (``elasticjob timeline``); the throughput is the series of
``job_throughput.py`` (windows of training time; what a rollback threw away dashed grey).

Plotting needs matplotlib (the ``plot`` extra: ``pip install 'elasticjob[plot]'``).
"""

from __future__ import annotations

import datetime
import html
import io
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from elasticjob.driver.job_record import EventKind, JobRecordData, RecordEvent
from elasticjob.job_throughput import Window, throughput, window_length

EVENT_STYLE: Final = {
    EventKind.FAILURE: ("tab:red", "failure"),
    EventKind.BLACKLISTED: ("tab:orange", "host blacklisted"),
    EventKind.SCALE: ("tab:blue", "scale request"),
    EventKind.CHECKPOINT: ("tab:green", "checkpoint"),
    EventKind.RESTORED: ("tab:purple", "restored from a checkpoint"),
    EventKind.ADOPTED: ("tab:gray", "operator handover"),
    EventKind.SUSPENDED: ("tab:brown", "suspended"),
    EventKind.STRAGGLER: ("tab:olive", "straggler"),
    EventKind.HEALTH_CHECK_FAILED: ("tab:pink", "failed health check"),
}
"""Colour and legend label of the events drawn as vertical lines."""

CAUSES: Final = ("startup", "recovery", "rollback", "resize")


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed."""


@dataclass(frozen=True)
class Summary:
    """The figures of a job record that an incident report quotes."""

    start: datetime.datetime
    duration_s: float
    goodput: float
    lost_seconds: dict[str, float]
    rounds: int
    failures: int
    blacklisted: int
    scale_requests: int
    largest_world: int
    handovers: int = 0
    """Times an operator took the running job over (it restarted, or another replica led)."""
    suspensions: int = 0
    """Times the job was suspended."""
    stragglers: int = 0
    """Members flagged as stragglers."""
    failed_health_checks: int = 0
    """New pods that failed their health check (not admitted)."""

    def lines(self) -> list[str]:
        """The summary as short lines of text."""
        lost = ", ".join(f"{c} {self.lost_seconds.get(c, 0.0):.1f} s" for c in CAUSES)
        return [
            f"started {self.start:%Y-%m-%d %H:%M:%S} UTC, ran {_duration(self.duration_s)}",
            f"goodput {self.goodput:.1%}; time lost: {lost}",
            f"{self.rounds} rounds, {self.failures} failures, {self.blacklisted} hosts "
            f"blacklisted, {self.scale_requests} scale requests, up to {self.largest_world} "
            f"workers, {self.handovers} operator handovers, {self.suspensions} suspensions, "
            f"{self.stragglers} stragglers, {self.failed_health_checks} failed health checks",
        ]


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def summarize(record: JobRecordData) -> Summary:
    """The :class:`Summary` of ``record``."""
    times = [e.t for e in record.events] + [s.t for s in record.samples]
    start = min(times, default=record.written_at)
    finished = [e.t for e in record.events if e.kind is EventKind.FINISHED]
    end = finished[-1] if finished else max([*times, record.written_at])
    kinds = Counter(e.kind for e in record.events)
    return Summary(
        start=datetime.datetime.fromtimestamp(start, datetime.UTC),
        duration_s=max(end - start, 0.0),
        goodput=record.goodput,
        lost_seconds={cause.value: s for cause, s in record.state.lost_seconds.items()},
        rounds=kinds[EventKind.ROUND],
        failures=kinds[EventKind.FAILURE],
        blacklisted=kinds[EventKind.BLACKLISTED],
        scale_requests=kinds[EventKind.SCALE],
        handovers=kinds[EventKind.ADOPTED],
        suspensions=kinds[EventKind.SUSPENDED],
        stragglers=kinds[EventKind.STRAGGLER],
        failed_health_checks=kinds[EventKind.HEALTH_CHECK_FAILED],
        largest_world=max(
            [s.world_size for s in record.samples] + [e.world_size for e in record.events],
            default=0,
        ),
    )


def _pyplot() -> Any:
    try:
        import matplotlib  # noqa: PLC0415 (an optional dependency)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as exc:
        raise PlotUnavailableError(
            "drawing a timeline needs matplotlib: pip install 'elasticjob[plot]'"
        ) from exc
    return plt


PAUSE_STYLE: Final = {
    EventKind.STARTED: ("0.6", "startup"),
    EventKind.FAILURE: ("tab:red", "recovery"),
    EventKind.RESIZED: ("tab:cyan", "resize pause"),
    EventKind.SUSPENDED: ("tab:brown", "suspended"),
}
"""Colour and label of the shaded pauses, by the event that starts them (a pause ends when
training resumes)."""


def pauses(record: JobRecordData) -> list[tuple[float, float, EventKind]]:
    """The stretches without training: (start, end, the kind of event that began it); a
    failure during a pause makes the rest of it a recovery."""
    found: list[tuple[float, float, EventKind]] = []
    since: tuple[float, EventKind] | None = None
    for event in record.events:
        if event.kind in PAUSE_STYLE:
            if since is None:
                since = (event.t, event.kind)
            elif event.kind is EventKind.FAILURE and since[1] is EventKind.RESIZED:
                since = (since[0], EventKind.FAILURE)
        elif event.kind is EventKind.RESUMED and since is not None:
            found.append((since[0], event.t, since[1]))
            since = None
    if since is not None:
        found.append((since[0], max(record.written_at, since[0]), since[1]))
    return found


def _time_unit(duration_s: float) -> tuple[float, str]:
    if duration_s < 300:
        return 1.0, "seconds"
    if duration_s < 5 * 3600:
        return 60.0, "minutes"
    return 3600.0, "hours"


ROLLED_BACK: Final = "rolled back, trained again"
"""The legend label of the throughput of training that a rollback threw away."""


def _steps(
    windows: Sequence[Window], at: Callable[[float], float]
) -> tuple[list[float], list[float]]:
    """The line of ``windows``: flat over each, broken (NaN) where they do not meet."""
    xs: list[float] = []
    ys: list[float] = []
    for i, window in enumerate(windows):
        if i and windows[i - 1].end != window.start:
            xs.append(math.nan)
            ys.append(math.nan)
        xs += [at(window.start), at(window.end)]
        ys += [window.samples_per_second] * 2
    return xs, ys


def _figure(record: JobRecordData) -> Any:
    """The matplotlib figure of ``record``: world size above, throughput below, pauses
    shaded and events marked."""
    plt = _pyplot()
    summary = summarize(record)
    t0 = summary.start.timestamp()
    scale, unit = _time_unit(summary.duration_s)

    def at(t: float) -> float:
        return (t - t0) / scale

    end = t0 + summary.duration_s
    fig, (size_ax, rate_ax) = plt.subplots(
        2, 1, figsize=(12, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    size_points = sorted(
        [(t0, 0)]
        + [(s.t, s.world_size) for s in record.samples]
        + [(e.t, e.world_size) for e in record.events if e.kind is EventKind.ROUND]
    )
    xs = [at(t) for t, _ in size_points] + [at(end)]
    ys = [w for _, w in size_points] + [size_points[-1][1]]
    size_ax.step(xs, ys, where="post", color="black", linewidth=2, label="world size")
    size_ax.set_ylim(0, max(ys) + 1)
    size_ax.set_ylabel("workers")
    spans = [(start, stop) for start, stop, _ in pauses(record)]
    windows = throughput(record, spans, window_length(summary.duration_s))
    if windows:
        for kept, colour, dashes, label in (
            (True, "tab:purple", "-", None),
            (False, "0.45", "--", ROLLED_BACK),
        ):
            line_x, line_y = _steps([w for w in windows if w.kept is kept], at)
            rate_ax.plot(line_x, line_y, color=colour, linestyle=dashes, linewidth=1.5, label=label)
        rate_ax.set_ylim(0, max(w.samples_per_second for w in windows) * 1.1)
        if not all(w.kept for w in windows):
            rate_ax.legend(loc="lower right", fontsize=9, framealpha=0.9)
    else:
        rate_ax.text(
            0.5,
            0.5,
            "too few progress reports in training to measure throughput"
            if any(s.samples_per_second for s in record.samples)
            else "no throughput reported (hvd.report_progress(epoch, step, samples_per_second))",
            transform=rate_ax.transAxes,
            ha="center",
            va="center",
            color="0.4",
        )
    rate_ax.set_ylabel("samples/s")
    rate_ax.set_xlabel(f"{unit} since {summary.start:%Y-%m-%d %H:%M:%S} UTC")
    rate_ax.set_xlim(0, at(end))
    labelled: set[str] = set()
    least = at(end) * 0.004  # a pause of a few seconds in a long job still shows
    for start, stop, kind in pauses(record):
        colour, label = PAUSE_STYLE[kind]
        for ax in (size_ax, rate_ax):
            ax.axvspan(
                at(start),
                max(at(stop), at(start) + least),
                color=colour,
                alpha=0.25,
                linewidth=0,
                label=label if ax is size_ax and label not in labelled else None,
            )
        labelled.add(label)
    for event in record.events:
        style = EVENT_STYLE.get(event.kind)
        if style is None:
            continue
        colour, label = style
        for ax in (size_ax, rate_ax):
            ax.axvline(
                at(event.t),
                color=colour,
                linestyle="--" if event.kind is EventKind.SCALE else "-",
                alpha=0.8,
                linewidth=1.2,
                label=label if ax is size_ax and label not in labelled else None,
            )
        labelled.add(label)
    for ax in (size_ax, rate_ax):
        ax.grid(alpha=0.3)
    size_ax.legend(loc="lower right", fontsize=9, ncol=4, framealpha=0.9)
    size_ax.set_title(f"ElasticJob {record.job}", loc="left", fontsize=13, fontweight="bold")
    fig.text(0.01, 0.01, "\n".join(summary.lines()), fontsize=9, family="monospace", va="bottom")
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    return fig


def render(record: JobRecordData, out: Path) -> None:
    """Draw ``record`` to ``out``: a PNG (``.png``) or a self-contained HTML page (``.html``)."""
    suffix = out.suffix.lower()
    if suffix not in (".png", ".html"):
        raise ValueError(f"{out}: the picture is written as .png or .html")
    plt = _pyplot()
    fig = _figure(record)
    try:
        if suffix == ".png":
            fig.savefig(out, dpi=110)
            return
        svg = io.StringIO()
        fig.savefig(svg, format="svg")
    finally:
        plt.close(fig)
    out.write_text(_page(record, svg.getvalue()))


def _page(record: JobRecordData, svg: str) -> str:
    summary = summarize(record)
    rows = "\n".join(_event_row(e, summary.start.timestamp()) for e in record.events)
    lines = "".join(f"<li>{html.escape(line)}</li>" for line in summary.lines())
    body = svg[svg.index("<svg") :]
    title = html.escape(f"ElasticJob {record.job}")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1200px}}
table{{border-collapse:collapse;font-size:90%}}td,th{{border:1px solid #ccc;padding:2px 6px}}
</style></head><body>
<h1>{title}</h1><ul>{lines}</ul>
{body}
<h2>Events</h2>
<table><tr><th>time (UTC)</th><th>+min</th><th>event</th><th>round</th><th>workers</th>
<th>what</th></tr>
{rows}
</table></body></html>
"""


def _event_row(event: RecordEvent, t0: float) -> str:
    when = datetime.datetime.fromtimestamp(event.t, datetime.UTC)
    cells: Sequence[str] = (
        f"{when:%H:%M:%S}",
        f"{(event.t - t0) / 60:.1f}",
        event.kind.value,
        str(event.round),
        str(event.world_size),
        event.message,
    )
    return "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>"
