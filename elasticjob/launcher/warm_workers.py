"""Warm starts of ``elasticjob-run``'s workers: forked from the job's start server
(``worker_runtime/agents/start_server.py``), where torch is imported once.

When the worker command is ``python SCRIPT ...`` or ``python -m MODULE ...``
(:func:`~elasticjob.worker_runtime.agents.start_server.warm_start`), the launcher starts one
start server at the job's first worker and forks every worker from it, replacements and
workers added later too: a worker runs its first line in milliseconds instead of seconds, and
runs as ``python SCRIPT`` would (``warm_interpreter.py`` says what differs).

The server is started with the first worker's environment less the worker's own variables
(:data:`PER_WORKER_ENV`); a worker whose other variables differ starts cold, as does every
worker once the server failed. ``--no-warm-start`` starts every worker cold.

A *shared* start server (``elasticjob-run --serve-starts SOCKET``, used by ``elasticjob-run
--start-server SOCKET``) outlives the jobs it serves: jobs run one after another (a test suite, a
notebook's runs) pay for torch's imports once. It serves a job whose workers' environments
differ from its own in the job's variables too (:func:`shared_varying`); another job starts
a server of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Final, NoReturn

from elasticjob.library_env import ENV_PYTHONUNBUFFERED, with_worker_defaults
from elasticjob.script_env import HOROVOD_PLACE_ENV
from elasticjob.worker_contract import SCRIPT_LAUNCH_ENV, WorkerConfig, WorkerSettings, variable_of
from elasticjob.worker_runtime.agents.start_server import (
    WARM_INTERPRETER,
    StartServer,
    WarmStart,
    differing,
)

logger = logging.getLogger(__name__)

PER_WORKER_ENV: Final = frozenset(
    {
        name
        for key, field in WorkerConfig.model_fields.items()
        if key not in WorkerSettings.model_fields
        for name in variable_of(field).names
    }
    | SCRIPT_LAUNCH_ENV
    | set(HOROVOD_PLACE_ENV)
)
"""The variables that differ between two workers of a job: the worker contract's variables of
a process's own values (its credential, host, node, slot, address; the job's settings are
the same for all) and the script's place. Nothing reads them when torch is
imported, so a server started without them serves every worker."""


START_SERVER_ENV: Final = "ELASTICJOB_START_SERVER"
"""The default of ``elasticjob-run --start-server``: the socket of a shared start server."""
_JOB_PREFIX: Final = "ELASTICJOB_"
_SHELL_BOOKKEEPING: Final = frozenset({"_", "SHLVL", "PWD", "OLDPWD"})
"""What a shell sets for each command it runs (a server started from one shell serves jobs
started from another)."""


def shared_varying(
    server_env: Mapping[str, str], worker_env: Mapping[str, str]
) -> AbstractSet[str]:
    """The variables a worker's environment may differ in from a shared server's: the
    worker's own (:data:`PER_WORKER_ENV`), every ``ELASTICJOB_`` variable (the job's
    settings, which the worker runtime reads at ``init``; torch reads none at import) and a
    shell's bookkeeping."""
    names = server_env.keys() | worker_env.keys()
    job = {name for name in names if name.startswith(_JOB_PREFIX)}
    return PER_WORKER_ENV | _SHELL_BOOKKEEPING | job


def varying(server: StartServer, worker_env: Mapping[str, str]) -> AbstractSet[str]:
    """The variables ``worker_env`` may differ in from ``server``'s environment."""
    return shared_varying(server.env, worker_env) if server.shared else PER_WORKER_ENV


def shared_server(path: str, warm: WarmStart, worker_env: Mapping[str, str]) -> StartServer | None:
    """The shared start server at ``path`` where it serves ``warm``'s command and a worker
    of ``worker_env``; None otherwise (said in a warning: the job starts its own)."""
    try:
        server = StartServer.connect(path, warm)
    except (OSError, ValueError, KeyError, TypeError) as exc:  # none there, or no server
        logger.warning("not the start server at %s: %s", path, exc)
        return None
    differ = differing(server.env, worker_env, shared_varying(server.env, worker_env))
    if differ:
        logger.warning(
            "not the start server at %s: its environment differs from the job's in %s",
            path,
            ", ".join(differ),
        )
        server.close()
        return None
    logger.info("workers fork from the start server at %s", path)
    return server


def serve_starts(path: str, python: str) -> NoReturn:
    """Become a shared start server listening at ``path``, run by ``python`` (found on the
    path) in this environment with the worker defaults (``library_env``); its workers'
    output unbuffered, as the launcher's workers'."""
    env = {**with_worker_defaults(os.environ), ENV_PYTHONUNBUFFERED: "1"}
    os.execvpe(python, [python, WARM_INTERPRETER, "--listen", path], env)


def server_env(worker_env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a start server for a worker with ``worker_env``: the job's, less
    the worker's own variables (its credential among them)."""
    return {k: v for k, v in worker_env.items() if k not in PER_WORKER_ENV}


@dataclass
class StartedWorker:
    """A worker's process as the launcher follows it, started cold or warm."""

    pid: int
    """Its pid, which is also its process group's (it leads a session of its own)."""
    stdout: asyncio.StreamReader
    stderr: asyncio.StreamReader
    exited: asyncio.Future[int]
    """Its exit code once it ended (negative: the signal that ended it), whether or not its
    pipes are closed yet."""


async def start_warm(server: StartServer, env: Mapping[str, str], cwd: str) -> StartedWorker:
    """Fork a worker of ``server``'s command with ``env`` in ``cwd`` (``server``
    ``serves`` it, :data:`PER_WORKER_ENV` varying). Raises :class:`OSError` when the server
    cannot start it (the caller starts it cold)."""
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[int] = loop.create_future()

    def on_exit(code: int) -> None:  # on the server client's thread
        with contextlib.suppress(RuntimeError):  # the launcher's loop has ended
            loop.call_soon_threadsafe(_settle, exited, code)

    stdout_read, stdout_write = os.pipe()
    stderr_read, stderr_write = os.pipe()
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        # The first start waits for the server's imports: off the event loop.
        pid = await asyncio.to_thread(
            server.start, env, cwd, (null, stdout_write, stderr_write), on_exit
        )
    except BaseException:
        os.close(stdout_read)
        os.close(stderr_read)
        raise
    finally:
        for fd in (null, stdout_write, stderr_write):
            os.close(fd)
    return StartedWorker(pid, await _reader(stdout_read), await _reader(stderr_read), exited)


def _settle(exited: asyncio.Future[int], code: int) -> None:
    if not exited.done():
        exited.set_result(code)


async def _reader(fd: int) -> asyncio.StreamReader:
    """A stream of the pipe ``fd`` reads, on the running loop."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**16, loop=loop)
    pipe = os.fdopen(fd, "rb", buffering=0)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop), pipe)
    return reader
