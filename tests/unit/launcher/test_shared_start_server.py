"""A shared start server (``elasticjob-run --serve-starts``, ``--start-server``): jobs one
after another fork their workers from one interpreter; a job's workers end with its
launcher's connection, not with the server's other clients; a server that does not run the
job's interpreter in the job's environment is not used (the job starts its own). Real
processes, torch imported in the server."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from elasticjob.launcher.warm_workers import (
    PER_WORKER_ENV,
    shared_server,
    shared_varying,
    start_warm,
)
from elasticjob.library_env import ENV_PYTHONUNBUFFERED, with_worker_defaults
from elasticjob.worker_runtime.agents.start_server import StartServer, WarmStart, serves
from tests.support.start_servers import launcher_env, shared_start_server

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the server forks on Linux")

DEADLINE_S = 60.0
SYSTEM_PYTHON = "/usr/bin/python3"
SERVER = {"PATH": "/usr/bin", "OMP_NUM_THREADS": "1", "ELASTICJOB_JOB": "j", "SHLVL": "1"}


@pytest.mark.parametrize(
    ("worker", "expected"),
    [
        (SERVER, True),
        (SERVER | {"ELASTICJOB_JOB": "other", "ELASTICJOB_RENDEZVOUS_URL": "http://x"}, True),
        (SERVER | {"ELASTICJOB_TOKEN": "h.1", "HOROVOD_RANK": "3", "LOCAL_RANK": "1"}, True),
        (SERVER | {"SHLVL": "2", "_": "/usr/bin/elasticjob-run", "PWD": "/home/x"}, True),
        ({k: v for k, v in SERVER.items() if k != "ELASTICJOB_JOB"}, True),
        (SERVER | {"OMP_NUM_THREADS": "2"}, False),  # read when torch loads
        (SERVER | {"PYTHONPATH": "/x"}, False),
        (SERVER | {"TORCH_LOGS": "+dynamo"}, False),
        ({k: v for k, v in SERVER.items() if k != "PATH"}, False),
    ],
)
def test_a_shared_server_serves_any_job_whose_other_variables_are_its_own(
    worker: dict[str, str], expected: bool
) -> None:
    """Unlike a job's own server (whose job variables are its job's), a shared one serves
    every job: the job's variables vary too, and what a shell sets for each command."""
    assert serves(SERVER, worker, shared_varying(SERVER, worker)) is expected
    assert not serves(SERVER, SERVER | {"ELASTICJOB_JOB": "other"}, PER_WORKER_ENV)


SCRIPT = """
import os, sys, time
print(os.getppid(), "torch" in sys.modules, os.environ["ELASTICJOB_JOB"], flush=True)
if len(sys.argv) > 1:
    time.sleep(float(sys.argv[1]))
"""


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    """The jobs' folder: their script and the server's socket; any user may look in it (the
    socket's own mode keeps other users out)."""
    folder = Path(tempfile.mkdtemp(prefix="elasticjob-starts-"))
    try:
        folder.chmod(0o755)
        (folder / "job.py").write_text(SCRIPT)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[subprocess.Popen[str]]:
    """The module's shared server (its import of torch paid once)."""
    with shared_start_server(folder / "starts.sock") as started:
        yield started


def socket_of(folder: Path) -> str:
    return str(folder / "starts.sock")


def env_of(job: str) -> dict[str, str]:
    """A worker's environment as ``elasticjob-run`` makes it (the server's and the job's)."""
    return with_worker_defaults(launcher_env()) | {ENV_PYTHONUNBUFFERED: "1", "ELASTICJOB_JOB": job}


def gone(pid: int) -> bool:
    """Whether ``pid`` has ended (a zombie has: its parent has yet to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + DEADLINE_S
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return gone(pid)


async def test_jobs_one_after_another_fork_from_one_server(
    server: subprocess.Popen[str], folder: Path
) -> None:
    """Two jobs in turn, each a client: every worker is the server's child, torch imported,
    its own job's environment; the server's greeting is the environment it was started with
    (not what torch's imports added to it)."""
    warm = WarmStart(sys.executable, ("job.py",), None)
    for job in ("first", "second"):
        client = StartServer.connect(socket_of(folder), warm)
        try:
            assert client.shared
            # with the worker defaults, as the launcher's workers
            assert client.env == with_worker_defaults(launcher_env()) | {ENV_PYTHONUNBUFFERED: "1"}
            worker = await start_warm(client, env_of(job), str(folder))
            line = await asyncio.wait_for(worker.stdout.readline(), DEADLINE_S)
            assert await asyncio.wait_for(worker.exited, DEADLINE_S) == 0
        finally:
            client.close()
        assert line.decode().split() == [str(server.pid), "True", job]


async def test_a_clients_end_takes_its_workers_and_no_other_clients(
    server: subprocess.Popen[str], folder: Path
) -> None:
    """A launcher gone (its socket closed) takes its running workers, as a job's own server
    would end them; another job's keep running, and end by SIGTERM as a fresh interpreter
    does (the server's own stop handlers are not theirs)."""
    warm = WarmStart(sys.executable, ("job.py", "120"), None)
    leaving = StartServer.connect(socket_of(folder), warm)
    staying = StartServer.connect(socket_of(folder), warm)
    try:
        left = await start_warm(leaving, env_of("leaving"), str(folder))
        kept = await start_warm(staying, env_of("staying"), str(folder))
        for worker in (left, kept):
            assert await asyncio.wait_for(worker.stdout.readline(), DEADLINE_S)
        leaving.close()
        assert await asyncio.to_thread(wait_gone, left.pid), "the gone client's worker lives"
        assert not gone(kept.pid), "another client's worker was taken too"
        os.kill(kept.pid, signal.SIGTERM)
        assert await asyncio.wait_for(kept.exited, DEADLINE_S) == -signal.SIGTERM
    finally:
        leaving.close()
        staying.close()


async def test_a_stopped_server_ends_its_workers_and_removes_its_socket(tmp_path: Path) -> None:
    (tmp_path / "job.py").write_text(SCRIPT)
    with shared_start_server(tmp_path / "starts.sock") as server:
        await stop_a_server_with_a_worker(server, tmp_path)


async def stop_a_server_with_a_worker(server: subprocess.Popen[str], folder: Path) -> None:
    client = StartServer.connect(
        socket_of(folder), WarmStart(sys.executable, ("job.py", "120"), None)
    )
    try:
        worker = await start_warm(client, env_of("job"), str(folder))
        assert await asyncio.wait_for(worker.stdout.readline(), DEADLINE_S)
        server.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(worker.exited, DEADLINE_S) == -signal.SIGKILL
    finally:
        client.close()
    assert server.wait(timeout=DEADLINE_S) == 0
    assert not Path(socket_of(folder)).exists()


def test_a_server_not_of_the_jobs_interpreter_or_environment_is_not_used(
    server: subprocess.Popen[str], folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each says why in a warning, and the job starts its own server."""
    path = socket_of(folder)
    ours = WarmStart(sys.executable, ("job.py",), None)
    caplog.set_level(logging.WARNING)
    assert shared_server(path, WarmStart("/usr/bin/env", ("job.py",), None), env_of("j")) is None
    assert f"runs {sys.executable}, not /usr/bin/env" in caplog.text
    assert (
        shared_server(path, ours, env_of("j") | {"PYTHONPATH": "/x", "OMP_NUM_THREADS": "3"})
        is None
    )
    assert "its environment differs from the job's in OMP_NUM_THREADS, PYTHONPATH" in caplog.text
    assert shared_server(str(folder / "none.sock"), ours, env_of("j")) is None
    assert "not the start server at" in caplog.text.splitlines()[-1]
    used = shared_server(path, ours, env_of("j"))
    assert used is not None
    used.close()


@pytest.mark.skipif(
    os.getuid() != 0 or not Path(SYSTEM_PYTHON).exists(),
    reason="needs another user to connect as, and an interpreter that user may run",
)
def test_another_user_cannot_connect(server: subprocess.Popen[str], folder: Path) -> None:
    """Whoever connects runs code as the server's user: only that user may."""
    probe = (
        "import json, sys, socket\n"
        "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
        "try:\n    s.connect(sys.argv[1])\nexcept OSError as e:\n    print(json.dumps(e.errno))\n"
        "else:\n    print(json.dumps(len(s.recv(4096))))\n"
    )
    nobody = subprocess.run(
        [SYSTEM_PYTHON, "-c", probe, socket_of(folder)],
        user=65534,
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=True,
    )
    assert json.loads(nobody.stdout) == 13, "EACCES: the socket is its user's only"
