"""``elasticjob-run``'s warm starts (``warm_workers.py``): which environments one start server
serves, and that a worker forked from it runs as ``python script.py`` would, gets its own
random seeds and session, and ends with its server. Real processes, torch imported in the
server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from elasticjob.launcher.warm_workers import (
    PER_WORKER_ENV,
    StartedWorker,
    start_warm,
)
from elasticjob.library_env import ENV_PYTHONUNBUFFERED
from elasticjob.worker_contract import ENV_TOKEN
from elasticjob.worker_runtime.agents.start_server import StartServer, WarmStart, serves

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the server forks on Linux")

DEADLINE_S = 60.0

SERVER = {"PATH": "/usr/bin", "OMP_NUM_THREADS": "1", "ELASTICJOB_JOB": "j"}


@pytest.mark.parametrize(
    ("worker", "expected"),
    [
        (SERVER, True),
        (
            SERVER
            | {"ELASTICJOB_TOKEN": "h.1", "ELASTICJOB_HOSTNAME": "h", "ELASTICJOB_LOCAL_RANK": "1"},
            True,
        ),
        (SERVER | {"HOROVOD_RANK": "3", "HOROVOD_SIZE": "4", "LOCAL_RANK": "1"}, True),
        (SERVER | {"OMP_NUM_THREADS": "2"}, False),  # read when torch loads
        (SERVER | {"ELASTICJOB_JOB": "other"}, False),  # the job's: the same for every worker
        (SERVER | {"PYTHONPATH": "/x"}, False),
        ({k: v for k, v in SERVER.items() if k != "PATH"}, False),
    ],
)
def test_a_server_serves_workers_that_differ_in_their_own_variables_only(
    worker: dict[str, str], expected: bool
) -> None:
    assert serves(SERVER, worker, PER_WORKER_ENV) is expected


def test_the_workers_own_variables_are_their_place_and_credential() -> None:
    assert {ENV_TOKEN, "HOROVOD_RANK", "HOROVOD_LOCAL_RANK", "LOCAL_RANK"} <= PER_WORKER_ENV
    assert not {"ELASTICJOB_JOB", "ELASTICJOB_RENDEZVOUS_URL", "OMP_NUM_THREADS"} & PER_WORKER_ENV


SCRIPT = """
import json, os, random, sys
import helper  # beside the script: its folder is on the module path
import numpy, torch
out = {"name": __name__, "file": __file__, "argv": sys.argv, "path0": sys.path[0],
       "cwd": os.getcwd(), "rank": os.environ.get("HOROVOD_RANK"), "stdin": sys.stdin.read(),
       "session": os.getsid(0) == os.getpid(), "dynamo": "torch._dynamo" in sys.modules,
       "random": random.random(), "numpy": float(numpy.random.rand())}
print(json.dumps(out), flush=True)
print("to stderr", file=sys.stderr)
sys.exit(int(os.environ.get("EXIT", "0")))
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text(SCRIPT)
    (tmp_path / "proj" / "helper.py").write_text("")
    monkeypatch.chdir(tmp_path)
    return tmp_path


async def ended(worker: StartedWorker) -> tuple[int, bytes, bytes]:
    """The worker's exit code, standard output and error."""
    code, out, err = await asyncio.wait_for(
        asyncio.gather(worker.exited, worker.stdout.read(), worker.stderr.read()), DEADLINE_S
    )
    return code, out, err


async def test_a_forked_worker_runs_as_python_script_py_with_its_own_seeds(
    project: Path,
) -> None:
    """The same script started cold, then twice from one server: it sees the same (its
    ``__file__``, ``sys.argv``, module path, its own session...) but for what the server
    imported ahead, and each start draws its own random numbers."""
    script = "proj/train.py"
    env = {**os.environ, ENV_PYTHONUNBUFFERED: "1", "HOROVOD_RANK": "5", "EXIT": "3"}
    env.pop("PYTHONPATH", None)
    cold = subprocess.run(
        [sys.executable, script, "--lr", "1"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        start_new_session=True,  # as the launcher starts a worker cold
        check=False,
    )
    assert cold.returncode == 3, cold.stderr
    expected = json.loads(cold.stdout)
    warm = WarmStart(sys.executable, (script, "--lr", "1"), None)
    server = StartServer(warm, env | {"HOROVOD_RANK": "0"})
    try:
        seen = []
        for rank in (1, 2):
            worker = await start_warm(server, env | {"HOROVOD_RANK": str(rank)}, str(project))
            code, out, err = await ended(worker)
            assert (code, err) == (3, b"to stderr\n"), "its own exit status and stderr"
            seen.append(json.loads(out))
    finally:
        server.close()
    same = {"random", "numpy", "rank", "dynamo"}
    for start in seen:
        assert {k: v for k, v in start.items() if k not in same} == {
            k: v for k, v in expected.items() if k not in same
        }
        assert start["dynamo"] is True and expected["dynamo"] is False, "imported ahead"
    assert [s["rank"] for s in seen] == ["1", "2"]
    assert seen[0]["path0"] == str(project / "proj") and seen[0]["session"] is True
    assert seen[0]["stdin"] == "" and seen[0]["name"] == "__main__"
    assert seen[0]["random"] != seen[1]["random"], "Python's generator seeded anew"
    assert seen[0]["numpy"] != seen[1]["numpy"], "NumPy's generator seeded anew"


async def test_a_killed_worker_reports_its_signal_and_a_closed_server_takes_its_workers(
    project: Path,
) -> None:
    (project / "proj" / "wait.py").write_text(
        "import time; print('up', flush=True); time.sleep(60)"
    )
    warm = WarmStart(sys.executable, ("proj/wait.py",), None)
    server = StartServer(warm, os.environ)
    try:
        killed, left = [await start_warm(server, os.environ, str(project)) for _ in range(2)]
        for worker in (killed, left):
            assert await asyncio.wait_for(worker.stdout.readline(), DEADLINE_S) == b"up\n"
        os.killpg(killed.pid, signal.SIGKILL)
        assert await asyncio.wait_for(killed.exited, DEADLINE_S) == -signal.SIGKILL
    finally:
        server.close()
    assert await asyncio.wait_for(left.exited, DEADLINE_S) == -signal.SIGKILL
    assert await asyncio.wait_for(left.stdout.read(), DEADLINE_S) == b"", "its pipes closed"
    with pytest.raises(OSError, match="closed"):
        await start_warm(server, os.environ, str(project))


async def test_an_uncaught_exception_is_told_from_the_scripts_first_frame(
    project: Path,
) -> None:
    (project / "proj" / "fail.py").write_text(
        "def go():\n    raise SystemError('on purpose')\ngo()\n"
    )
    warm = WarmStart(sys.executable, ("proj/fail.py",), None)
    server = StartServer(warm, os.environ)
    try:
        code, _, err = await ended(await start_warm(server, os.environ, str(project)))
    finally:
        server.close()
    lines = err.decode().splitlines()
    assert code == 1
    assert lines[:2] == [
        "Traceback (most recent call last):",
        f'  File "{project / "proj" / "fail.py"}", line 3, in <module>',
    ], "from the script's first frame, as python prints it"
    assert lines[-1] == "SystemError: on purpose"
    assert "warm_interpreter" not in err.decode()


async def test_a_start_larger_than_a_socket_buffer_is_passed_whole(project: Path) -> None:
    """An environment can be large (a pod gets a variable per service): the start goes as a
    file, never as one message."""
    (project / "proj" / "size.py").write_text("import os; print(len(os.environ['BIG']))")
    warm = WarmStart(sys.executable, ("proj/size.py",), None)
    server = StartServer(warm, os.environ)
    try:
        env = {**os.environ, "BIG": "x" * 3_000_000}
        code, out, _ = await ended(await start_warm(server, env, str(project)))
    finally:
        server.close()
    assert (code, out) == (0, b"3000000\n")
