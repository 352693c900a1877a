"""The worker runtime's package imports nothing until a name is used (PEP 562): importing it,
or running a pod's slot supervisor, imports no torch; the first public name used brings the
whole Horovod API."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import elasticjob.worker_runtime as hvd

REPO = Path(__file__).resolve().parents[3]
PROBE = """
import sys
import elasticjob.worker_runtime as hvd
import elasticjob.worker_runtime.agents.slot_supervisor
before = "torch" in sys.modules
rank = hvd.rank
print("RESULT", before, "torch" in sys.modules, callable(rank), "allreduce" in dir(hvd))
"""


def test_importing_the_runtime_imports_no_torch_until_a_name_is_used() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "RESULT False True True True" in result.stdout, result.stdout + result.stderr


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        getattr(hvd, "no_such_name")  # noqa: B009
