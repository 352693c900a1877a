"""Importing the devcluster package is cheap: it loads none of its modules."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.devcluster


def test_importing_the_package_loads_no_module_of_it() -> None:
    script = (
        "import json, sys; import devcluster; "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'devcluster')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(result.stdout) == ["devcluster"]
