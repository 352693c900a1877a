"""``init()`` after ``shutdown()`` in the same process, as with Horovod's Gloo controller: the
same world forms again (same ranks and size, collectives across every rank), the queries
raise in between, and the job ends with one result per worker. Over 2 and 3 processes of a
launcher job, and standalone."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.worker_scripts import HOSTS, launcher, run

pytestmark = pytest.mark.integration

WORKER = Path(__file__).parent / "workers" / "reinit_worker.py"


@pytest.mark.parametrize("size", [1, 2, 3], ids=["standalone", "2 processes", "3 processes"])
def test_init_after_shutdown_forms_the_same_world_again(tmp_path: Path, size: int) -> None:
    out = tmp_path / "results"
    command = [sys.executable, str(WORKER), "--out", str(out)]
    if size > 1:
        command = launcher("-np", str(size), "-H", "127.0.1.1:2" if size == 2 else HOSTS, *command)
    job = run(command, out)
    assert job.returncode == 0 and len(job.results) == size, job.explain()
    total = size * (size + 1) / 2
    for rank, result in enumerate(job.results):
        assert result["seen"] == [{"rank": rank, "size": size, "sum": total}] * 3, result
        for gap in result["between"]:
            assert gap["initialized"] is False and "init()" in gap["rank_error"], gap
    assert "already reported its result" not in job.stdout + job.stderr, job.explain()
