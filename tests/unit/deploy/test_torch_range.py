"""The torch versions the project declares are the ones CI installs and tests."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _pinned_in_setup_script() -> str:
    script = (REPO / "scripts/setup-venv.sh").read_text()
    match = re.search(r"torch==([0-9.]+)", script)
    assert match, "scripts/setup-venv.sh pins no torch version"
    return match.group(1)


def test_the_worker_extra_admits_only_the_tested_torch_minor() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    torch_requirements = [r for r in extras["worker"] if r.startswith("torch")]
    tested = _pinned_in_setup_script()
    major, minor = (int(part) for part in tested.split(".")[:2])
    assert torch_requirements == [f"torch>={major}.{minor},<{major}.{minor + 1}"]
    dockerfile = (REPO / "Dockerfile.worker").read_text()
    assert f"ARG TORCH_VERSION={tested}" in dockerfile
