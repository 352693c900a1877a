"""Starting a restart-mode script in a spare interpreter (``warm_interpreter.py``): which
commands may, which environments a spare serves, and that the script runs there as
``python script.py`` or ``python -m module`` runs it (real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from elasticjob.script_env import PER_START_ENV, serves_start
from elasticjob.worker_runtime.agents.script_process import ScriptProcess, WarmStart, warm_start

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
    ("start", "serves"),
    [
        (BASE, True),
        (BASE | {"RANK": "3", "WORLD_SIZE": "4", "MASTER_PORT": "2"}, True),
        (BASE | {"TORCHELASTIC_RESTART_COUNT": "2", "GROUP_RANK": "1"}, True),
        (BASE | {"OMP_NUM_THREADS": "2"}, False),  # read when torch loads
        (BASE | {"CUDA_VISIBLE_DEVICES": "1"}, False),
        ({k: v for k, v in BASE.items() if k != "PATH"}, False),
    ],
)
def test_a_spare_serves_starts_that_differ_in_their_place_only(
    start: dict[str, str], serves: bool
) -> None:
    assert serves_start(BASE, start) is serves


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
       "dynamo": "torch._dynamo" in sys.modules, "spare_var": os.environ.get("SPARE_ONLY"),
       "threads": torch.get_num_threads()}
open(os.environ["OUT"], "w").write(json.dumps(out))
sys.exit(int(os.environ.get("EXIT", "0")))
"""


def run_in_spare(
    start: WarmStart, env: dict[str, str], cwd: Path, monkeypatch: pytest.MonkeyPatch
) -> int:
    """Start a spare with an environment of its own, release it with ``env`` from ``cwd``;
    its return code."""
    ended = threading.Event()
    spare = ScriptProcess.spare(start, {**os.environ, "SPARE_ONLY": "1"})
    monkeypatch.chdir(cwd)
    assert spare.release(start, env, ended.set)
    assert ended.wait(DEADLINE_S), "the script never ended"
    assert spare.returncode is not None
    return spare.returncode


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text(SCRIPT)
    (tmp_path / "proj" / "helper.py").write_text("")
    (tmp_path / "run").mkdir()
    return tmp_path


def test_a_script_runs_in_the_spare_as_python_script_py(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same script started cold, then in a spare: it sees the same (its ``__file__``,
    ``sys.argv``, module path, torch's threads after it set ``OMP_NUM_THREADS``...), but for
    what the spare imported ahead."""
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
    assert run_in_spare(start, env, project / "run", monkeypatch) == 3, "its own exit status"
    seen = json.loads(out.read_text())
    assert expected["dynamo"] is False and seen["dynamo"] is True, "imported ahead"
    assert seen == expected | {"dynamo": True}
    assert seen["file"] == str(project / "run" / script) and seen["argv"][0] == script
    assert seen["path0"] == str(project / "proj"), "the script's real folder"
    assert (seen["rank"], seen["stdin"], seen["spare_var"]) == ("5", "", None)


def test_a_module_runs_in_the_spare_as_python_m(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = project / "out.json"
    env = {**os.environ, "OUT": str(out)}
    start = WarmStart(sys.executable, ("train", "-x"), "train")
    assert run_in_spare(start, env, project / "proj", monkeypatch) == 0
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
    ended = threading.Event()
    spare = ScriptProcess.spare(start, os.environ)
    assert spare.release(start, dict(os.environ), ended.set)
    assert ended.wait(DEADLINE_S)
    assert spare.returncode == 1
    assert "SystemError: on purpose" in spare.log_tail()


def test_a_discarded_spare_ends_and_cannot_be_released() -> None:
    start = WarmStart(sys.executable, ("unused.py",), None)
    spare = ScriptProcess.spare(start, os.environ)
    spare.discard()
    assert spare.returncode is not None
    assert not spare.release(start, dict(os.environ), lambda: None)


def test_a_start_larger_than_a_pipe_is_passed_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pods get many service variables: the start goes through a file, never blocking the
    agent on a full pipe while the spare still imports torch."""
    script = tmp_path / "size.py"
    script.write_text("import os; open(os.environ['OUT'], 'w').write(str(len(os.environ['BIG'])))")
    out = tmp_path / "out.txt"
    env = {**os.environ, "OUT": str(out), "BIG": "x" * 300_000}
    start = WarmStart(sys.executable, (str(script),), None)
    assert run_in_spare(start, env, tmp_path, monkeypatch) == 0
    assert out.read_text() == "300000"
