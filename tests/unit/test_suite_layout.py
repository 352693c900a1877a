"""The test suites' layout: the devcluster fixtures are loaded only by the suites that need a
cluster, so unit and integration runs never import devcluster."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import sys
import pytest
args = ["-q", "--collect-only", "-p", "no:cacheprovider", "tests/unit/driver/test_slots.py"]
code = pytest.main(args)
loaded = sorted(m for m in sys.modules if m == "devcluster" or m.startswith("devcluster."))
print("RESULT", int(code), loaded)
"""


def test_a_unit_run_does_not_import_devcluster() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "RESULT 0 []" in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]
