"""The job record of a real local run (``elasticjob-run --job-record``) and its timeline
picture (``elasticjob timeline``): it must show the rounds, the failure, the blacklisting
and where the time went."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from elasticjob.driver.goodput import LostTo
from elasticjob.driver.job_record import EventKind, JobRecordData
from tests.support.job_runs import run_job

pytestmark = pytest.mark.integration


def test_a_failure_shows_in_the_record_and_its_timeline(tmp_path: Path) -> None:
    record_file = tmp_path / "job.json"
    run = run_job(
        tmp_path,
        launcher_args=[
            "-np",
            "4",
            "--min-np",
            "2",
            "-H",
            "127.0.1.1:2,127.0.1.2:2",
            "--job-record",
            str(record_file),
            "--job-name",
            "recorded",
        ],
        worker_args=["--epochs", "2", "--samples", "96", "--fail", "1:3:3:sigkill"],
    )
    assert run.returncode == 0, run.explain()
    record = JobRecordData.model_validate_json(record_file.read_bytes())
    assert record.job == "recorded"
    kinds = [e.kind for e in record.events]
    assert kinds[0] is EventKind.STARTED and kinds[-1] is EventKind.FINISHED
    rounds = [(e.round, e.world_size) for e in record.events if e.kind is EventKind.ROUND]
    assert rounds == [(1, 4), (2, 2)], record.events
    (failure,) = [e for e in record.events if e.kind is EventKind.FAILURE]
    assert "127.0.1.2" in failure.message and failure.round == 1
    blacklisted = [e.message for e in record.events if e.kind is EventKind.BLACKLISTED]
    assert blacklisted and blacklisted[0].startswith("127.0.1.2"), blacklisted
    assert record.events[-1].message.startswith("succeeded")
    assert [e.t for e in record.events] == sorted(e.t for e in record.events)
    assert {s.world_size for s in record.samples} >= {4, 2}, "samples before and after"
    lost = record.state.lost_seconds
    assert lost[LostTo.STARTUP] > 0 and lost[LostTo.RECOVERY] > 0
    assert 0 < record.goodput < 1

    for picture in ("timeline.png", "timeline.html"):
        out = tmp_path / picture
        drawn = subprocess.run(
            [sys.executable, "-m", "elasticjob.cli", "timeline", str(record_file), "-o", str(out)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert drawn.returncode == 0, drawn.stderr
        assert str(out) in drawn.stdout
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (tmp_path / "timeline.html").read_text()
    assert "<svg" in page and "ElasticJob recorded" in page
    assert "<td>failure</td>" in page and "<td>blacklisted</td>" in page
    assert "goodput" in page
