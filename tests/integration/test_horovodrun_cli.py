"""``elasticjob-run`` with horovodrun's spellings: a hostfile, ``--min-num-proc``,
``--max-num-proc`` and ``--output-filename``, workers training over Gloo on loopback hosts."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

from tests.integration.harness import run_job

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
        ],
        worker_args=["--epochs", "2", "--samples", "64"],
        worker_prefix=["sh", "-c", 'echo "started on $HOROVOD_HOSTNAME"; exec "$@"', "sh"],
    )
    assert run.returncode == 0, run.explain()
    done = run.of("done")
    assert sorted(d["rank"] for d in done) == [0, 1, 2, 3], run.explain()
    assert {d["size"] for d in done} == {4}

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
