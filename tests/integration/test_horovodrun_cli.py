"""``elasticjob-run`` with horovodrun's spellings: a hostfile, ``--min-num-proc``,
``--max-num-proc``, ``--output-filename`` and ``--timeline-filename``, workers training over
Gloo on loopback hosts, one of them killed."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

from tests.support.job_runs import run_job

pytestmark = pytest.mark.integration

LINE = re.compile(r"^\[(?P<who>[^\]]+(?:\[\d+\])?)\]<(?P<stream>stdout|stderr)>:(?P<text>.*)$")


def expected_files(launcher_stdout: str) -> dict[str, str]:
    """What each output file must hold: every worker line the launcher printed, in the file of
    the rank (or worker, when it had no rank) it was printed for."""
    files: dict[str, str] = defaultdict(str)
    for line in launcher_stdout.splitlines():
        match = LINE.match(line)
        if match is None:
            continue
        who = match["who"]
        if who.isdigit():
            folder = f"rank.{who}"
        else:
            host, slot = who.rstrip("]").split("[")
            folder = f"unranked/{host}.{slot}"
        files[f"{folder}/{match['stream']}"] += match["text"] + "\n"
    return dict(files)


def test_horovodrun_spellings_with_a_hostfile_and_output_files(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# two loopback hosts\n127.0.1.1 slots=2\n\n127.0.1.2 slots=2  # b\n")
    out = tmp_path / "out"
    run = run_job(
        tmp_path,
        launcher_args=[
            "-np",
            "2",
            "--min-num-proc",
            "2",
            "--max-num-proc",
            "4",
            "--hostfile",
            str(hostfile),
            "--output-filename",
            str(out),
            "--gloo",
            "--network-interfaces",
            "lo",
            "--log-level",
            "INFO",
            "--timeline-filename",
            str(tmp_path / "timeline.json"),
        ],
        # Rank 3 is killed in epoch 1: its host is blacklisted, the survivors roll back.
        worker_args=["--epochs", "2", "--samples", "64", "--fail", "1:2:3:sigkill"],
        worker_prefix=["sh", "-c", 'echo "started on $HOROVOD_HOSTNAME"; exec "$@"', "sh"],
    )
    assert run.returncode == 0, run.explain()
    done = run.of("done")
    assert sorted(d["rank"] for d in done) == [0, 1], run.explain()
    assert {d["size"] for d in done} == {2}
    assert "job succeeded after 2 rounds and 1 resets" in run.stderr

    written = {
        str(path.relative_to(out)): path.read_text() for path in out.rglob("*") if path.is_file()
    }
    assert written == expected_files(run.stdout)
    for rank in range(4):
        assert written[f"rank.{rank}/stderr"], f"rank {rank} wrote no stderr: {sorted(written)}"
    started = [
        line
        for name, text in written.items()
        if name.endswith("/stdout")
        for line in text.splitlines()
        if line.startswith("started on ")
    ]
    assert sorted(started) == ["started on 127.0.1.1"] * 2 + ["started on 127.0.1.2"] * 2

    trace = json.loads((tmp_path / "timeline.json").read_text())
    events = trace["traceEvents"]
    processes = [e for e in events if e["ph"] == "M" and e["name"] == "process_name"]
    assert len(processes) == 4, processes
    pids = {e["pid"] for e in processes}
    assert {e["pid"] for e in events} == pids
    names = {e["name"] for e in events}
    assert {"join round", "reset", "commit", "shutdown", "allreduce"} <= names, names
    rounds = sorted(
        (e["args"]["round"], e["args"]["rank"]) for e in events if e["name"] == "join round"
    )
    assert rounds == [(1, 0), (1, 1), (1, 2), (1, 3), (2, 0), (2, 1)], rounds
    resets = [e["args"] for e in events if e["name"] == "reset"]
    assert resets == [{"left": 1, "joined": 2, "rolled_back": True}] * 2, resets
    for event in events:
        if event["ph"] == "X":
            assert isinstance(event["ts"], int) and event["dur"] >= 0, event
    assert not list(tmp_path.glob("elasticjob-timeline-*"))
