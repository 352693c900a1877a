"""The restart agent's environment (with the job's token) is not readable by the script it
starts: as in a pod, agent and script run as one user other than root, and the script tries
to read its parent's environ."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from elasticjob.worker_runtime.agents import undumpable

NOBODY = "65534"
READER = """
import os
try:
    with open(f"/proc/{os.getppid()}/environ", "rb") as f:
        print("read" if b"SECRET_OF_THE_AGENT" in f.read() else "absent")
except PermissionError:
    print("refused")
"""
AGENT = """
import importlib.util, subprocess, sys
if sys.argv[1] == "hide":
    spec = importlib.util.spec_from_file_location("undumpable", sys.argv[2])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.make_undumpable()
command = [sys.executable, "-c", sys.argv[3]]
print(subprocess.run(command, env={}, capture_output=True, text=True, check=True).stdout)
"""


@pytest.fixture(scope="module")
def module_copy() -> Iterator[Path]:
    """The module's source where any user may read it."""
    directory = Path(tempfile.mkdtemp())
    try:
        directory.chmod(0o755)
        copy = directory / "undumpable.py"
        shutil.copyfile(undumpable.__file__, copy)
        copy.chmod(0o644)
        yield copy
    finally:
        shutil.rmtree(directory)


def agent_output(module_copy: Path, hide: bool) -> str:
    """What the script of an agent (hiding its environment or not) finds in the agent's."""
    python, as_user = sys.executable, []
    if os.geteuid() == 0:  # as another user, with a Python that user may run
        python = "/usr/bin/python3"
        as_user = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
        if not os.access(python, os.X_OK) or shutil.which("setpriv") is None:
            pytest.skip("as root this needs setpriv and /usr/bin/python3 to run as another user")
    mode = "hide" if hide else "keep"
    result = subprocess.run(
        [*as_user, python, "-c", AGENT, mode, str(module_copy), READER],
        env={"SECRET_OF_THE_AGENT": "1", "PATH": "/usr/bin:/bin"},
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_the_script_cannot_read_the_environment_of_an_undumpable_agent(module_copy: Path) -> None:
    assert agent_output(module_copy, hide=False) == "read", "without it, the same user reads it"
    assert agent_output(module_copy, hide=True) == "refused"
