"""Starting a restart-mode script forked from the agent's start server (``start_server.py``,
``warm_interpreter.py``): which commands may, which environments one server serves, and that
the script runs there as ``python script.py`` or ``python -m module`` runs it (real
processes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from elasticjob.script_env import PER_START_ENV
from elasticjob.worker_runtime.agents.script_process import ScriptProcess
from elasticjob.worker_runtime.agents.start_server import (
    StartServer,
    WarmStart,
    serves,
    warm_start,
)

DEADLINE_S = 60.0


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["python", "train.py", "--lr", "1"], WarmStart("python", ("train.py", "--lr", "1"), None)),
        (
            ["/opt/venv/bin/python3.11", "t.py"],
            WarmStart("/opt/venv/bin/python3.11", ("t.py",), None),
        ),
        (
            ["python3", "-m", "pkg.train", "-x"],
            WarmStart("python3", ("pkg.train", "-x"), "pkg.train"),
        ),
        (["python", "-u", "train.py"], None),  # an interpreter option: cold
        (["python", "-c", "print(1)"], None),
        (["python", "-m"], None),
        (["python", "-m", "-x"], None),
        (["python"], None),
        (["bash", "run.sh"], None),
        (["pythonista", "train.py"], None),
        (["torchrun", "train.py"], None),
    ],
)
def test_which_commands_start_warm(command: list[str], expected: WarmStart | None) -> None:
    assert warm_start(command) == expected


BASE = {"PATH": "/usr/bin", "OMP_NUM_THREADS": "1", "RANK": "0", "MASTER_PORT": "1"}


@pytest.mark.parametrize(
    ("start", "expected"),
    [
        (BASE, True),
        (BASE | {"RANK": "3", "WORLD_SIZE": "4", "MASTER_PORT": "2"}, True),
        (BASE | {"TORCHELASTIC_RESTART_COUNT": "2", "GROUP_RANK": "1"}, True),
        (BASE | {"OMP_NUM_THREADS": "2"}, False),  # read when torch loads
        (BASE | {"CUDA_VISIBLE_DEVICES": "1"}, False),
        ({k: v for k, v in BASE.items() if k != "PATH"}, False),
    ],
)
def test_a_server_serves_starts_that_differ_in_their_place_only(
    start: dict[str, str], expected: bool
) -> None:
    assert serves(BASE, start, PER_START_ENV) is expected


def test_the_place_variables_are_torchruns() -> None:
    assert {"RANK", "WORLD_SIZE", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT"} <= PER_START_ENV
    assert not {"OMP_NUM_THREADS", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"} & PER_START_ENV


SCRIPT = """
import json, os, sys
os.environ["OMP_NUM_THREADS"] = "3"  # before torch is imported, as scripts do
import helper  # beside the script: its folder is on the module path
import torch
out = {"name": __name__, "file": __file__, "argv": sys.argv, "path0": sys.path[0],
       "cwd": os.getcwd(), "rank": os.environ.get("RANK"), "stdin": sys.stdin.read(),
       "dynamo": "torch._dynamo" in sys.modules, "server_var": os.environ.get("SERVER_ONLY"),
       "threads": torch.get_num_threads()}
open(os.environ["OUT"], "w").write(json.dumps(out))
sys.exit(int(os.environ.get("EXIT", "0")))
"""


def run_forked(
    start: WarmStart, env: dict[str, str], cwd: Path, monkeypatch: pytest.MonkeyPatch
) -> ScriptProcess:
    """Start a server with an environment of its own, fork ``start`` from it with ``env``
    from ``cwd``; the ended start."""
    ended = threading.Event()
    server = StartServer(start, {**os.environ, "SERVER_ONLY": "1"})
    try:
        monkeypatch.chdir(cwd)
        script = ScriptProcess.forked(server, env, ended.set)
        assert ended.wait(DEADLINE_S), "the script never ended"
    finally:
        server.close()
    return script


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text(SCRIPT)
    (tmp_path / "proj" / "helper.py").write_text("")
    (tmp_path / "run").mkdir()
    return tmp_path


def test_a_script_runs_forked_as_python_script_py(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same script started cold, then forked: it sees the same (its ``__file__``,
    ``sys.argv``, module path, torch's threads after it set ``OMP_NUM_THREADS``...), but for
    what the server imported ahead."""
    (project / "run" / "link").symlink_to(project / "proj")  # a mounted script's folder
    script = "link/train.py"  # relative to the working directory, through a link
    out = project / "out.json"
    env = {**os.environ, "RANK": "5", "OUT": str(out), "EXIT": "3"}
    env.pop("OMP_NUM_THREADS", None)
    monkeypatch.chdir(project / "run")
    cold = subprocess.run(
        [sys.executable, script, "--lr", "1"], env=env, stdin=subprocess.DEVNULL, check=False
    )
    assert cold.returncode == 3
    expected = json.loads(out.read_text())
    start = WarmStart(sys.executable, (script, "--lr", "1"), None)
    assert run_forked(start, env, project / "run", monkeypatch).returncode == 3, "its exit"
    seen = json.loads(out.read_text())
    assert expected["dynamo"] is False and seen["dynamo"] is True, "imported ahead"
    assert seen == expected | {"dynamo": True}
    assert seen["file"] == str(project / "run" / script) and seen["argv"][0] == script
    assert seen["path0"] == str(project / "proj"), "the script's real folder"
    assert (seen["rank"], seen["stdin"], seen["server_var"]) == ("5", "", None)


def test_a_module_runs_forked_as_python_m(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = project / "out.json"
    env = {**os.environ, "OUT": str(out)}
    start = WarmStart(sys.executable, ("train", "-x"), "train")
    assert run_forked(start, env, project / "proj", monkeypatch).returncode == 0
    seen = json.loads(out.read_text())
    assert seen["name"] == "__main__"
    assert seen["argv"] == [str(project / "proj" / "train.py"), "-x"]
    assert seen["path0"] == str(project / "proj"), "the working directory, as under -m"


def test_an_uncaught_exception_fails_the_start_as_it_would_cold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "fail.py"
    script.write_text("raise SystemError('on purpose')\n")
    start = WarmStart(sys.executable, (str(script),), None)
    ended = run_forked(start, dict(os.environ), tmp_path, monkeypatch)
    assert ended.returncode == 1
    assert "SystemError: on purpose" in ended.log_tail()


def test_a_closed_server_ends_its_starts_and_starts_no_more(tmp_path: Path) -> None:
    script = tmp_path / "wait.py"
    script.write_text("import time; time.sleep(60)")
    start = WarmStart(sys.executable, (str(script),), None)
    ended = threading.Event()
    server = StartServer(start, os.environ)
    running = ScriptProcess.forked(server, dict(os.environ), ended.set)
    server.close()
    assert ended.wait(DEADLINE_S), "the start outlived its server"
    assert running.returncode == -signal.SIGKILL
    with pytest.raises(OSError, match="closed"):
        ScriptProcess.forked(server, dict(os.environ), ended.set)
