"""The timeline picture: its summary figures, and a PNG and a self-contained HTML page."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.pyplot as plt
import pytest

from elasticjob.cli import main
from elasticjob.driver.goodput import LostTo
from elasticjob.driver.job_record import EventKind, JobRecordData, RecordEvent, RecordSample
from elasticjob.driver.job_state import JobState
from elasticjob.job_timeline import ROLLED_BACK, _figure, pauses, render, summarize

T0 = 1_790_000_000.0


def record() -> JobRecordData:
    events = (
        RecordEvent(t=T0, kind=EventKind.STARTED, message="created"),
        RecordEvent(t=T0 + 20, kind=EventKind.ROUND, round=1, world_size=4),
        RecordEvent(t=T0 + 21, kind=EventKind.RESUMED, round=1, world_size=4),
        RecordEvent(t=T0 + 300, kind=EventKind.SCALE, message="replicas 4 -> 6"),
        RecordEvent(t=T0 + 330, kind=EventKind.ROUND, round=2, world_size=6),
        RecordEvent(t=T0 + 900, kind=EventKind.FAILURE, message="a worker on <b> failed"),
        RecordEvent(t=T0 + 900.5, kind=EventKind.BLACKLISTED, message="b for 60 s"),
        RecordEvent(t=T0 + 902, kind=EventKind.ROUND, round=3, world_size=5),
        RecordEvent(
            t=T0 + 903, kind=EventKind.RESUMED, round=3, world_size=5, rolled_back_from=T0 + 700
        ),
        RecordEvent(t=T0 + 1000, kind=EventKind.ADOPTED, round=3, world_size=5),
        RecordEvent(t=T0 + 1100, kind=EventKind.SUSPENDED, message="suspended", round=3),
        RecordEvent(t=T0 + 1150, kind=EventKind.RESUMED, round=4, world_size=5),
    )
    samples = tuple(
        RecordSample(t=T0 + t, world_size=w, samples_per_second=r)
        for t, w, r in (
            (25, 4, 400.0),
            (200, 4, 400.0),
            (335, 6, 600.0),
            (800, 6, 600.0),
            (905, 5, 600.0),  # the rate from before the failure, re-sent with the resume
            (910, 5, 7000.0),  # the first measurement after it: all of an epoch by part of it
            (1000, 5, 500.0),
            (1200, 5, 500.0),
        )
    )
    return JobRecordData(
        job="ns.train",
        events=events,
        samples=samples,
        state=JobState(
            lost_seconds={
                LostTo.STARTUP: 20.0,
                LostTo.RECOVERY: 2.5,
                LostTo.ROLLBACK: 30.0,
                LostTo.RESIZE: 30.0,
            }
        ),
        goodput=0.93,
        written_at=T0 + 1200,
    )


def test_the_summary_quotes_what_an_incident_report_needs() -> None:
    summary = summarize(record())
    assert summary.duration_s == 1200
    assert (summary.rounds, summary.failures, summary.blacklisted) == (3, 1, 1)
    assert (summary.scale_requests, summary.largest_world, summary.handovers) == (1, 6, 1)
    assert summary.suspensions == 1
    text = "\n".join(summary.lines())
    assert "1 operator handovers, 1 suspensions" in text
    assert "ran 20m00s" in text and "goodput 93.0%" in text and "rollback 30.0 s" in text


def test_a_png_and_a_self_contained_html_page(tmp_path: Path) -> None:
    png, page = tmp_path / "t.png", tmp_path / "t.html"
    render(record(), png)
    render(record(), page)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = page.read_text()
    assert "<svg" in text
    assert "<script" not in text and "<link" not in text, "nothing is fetched from elsewhere"
    assert "a worker on &lt;b&gt; failed" in text, "messages are escaped"
    assert text.count("<tr>") == 1 + len(record().events)
    with pytest.raises(ValueError, match=r"\.png or \.html"):
        render(record(), tmp_path / "t.pdf")


def test_the_throughput_drawn_is_the_windows_of_training_not_the_reported_spike() -> None:
    fig = _figure(record())
    try:
        lines = {line.get_label(): line for line in fig.axes[1].get_lines()}
        drawn = [y for line in lines.values() for y in line.get_ydata() if not math.isnan(y)]
        assert max(drawn) == 600.0, "the 7,000 samples/s reported after the failure"
        assert set(lines[ROLLED_BACK].get_ydata()) == {600.0}, "from 700 s to the failure"
    finally:
        plt.close(fig)


def test_the_command_draws_a_record_file_and_says_where(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "job.json"
    source.write_text(record().model_dump_json())
    out = tmp_path / "out.png"
    assert main(["timeline", str(source), "-o", str(out)]) == 0
    assert f"written to {out}" in capsys.readouterr().out and out.exists()
    source.write_text("{not json")
    assert main(["timeline", str(source), "-o", str(out)]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_pauses_run_from_the_event_that_stops_training_to_the_next_resume() -> None:
    def at(t: float, kind: EventKind) -> RecordEvent:
        return RecordEvent(t=T0 + t, kind=kind)

    data = JobRecordData(
        job="ns.train",
        events=(
            at(0, EventKind.STARTED),
            at(5, EventKind.RESUMED),
            at(50, EventKind.RESIZED),
            at(51, EventKind.FAILURE),
            at(54, EventKind.RESUMED),
            at(70, EventKind.SUSPENDED),
            at(80, EventKind.STARTED),  # the resumed run starts, then trains
            at(85, EventKind.RESUMED),
            at(90, EventKind.FAILURE),
        ),
        written_at=T0 + 100,
    )
    assert [(start - T0, stop - T0, kind) for start, stop, kind in pauses(data)] == [
        (0, 5, EventKind.STARTED),
        (50, 54, EventKind.FAILURE),
        (70, 85, EventKind.SUSPENDED),
        (90, 100, EventKind.FAILURE),
    ]
