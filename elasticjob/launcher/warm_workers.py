"""Warm starts of ``elasticjob-run``'s workers: forked from a start server with torch imported.

A torch worker spends seconds before its first line runs (the interpreter, ``import torch``,
``torch._dynamo`` once it makes an optimizer), every worker of the job and every replacement
again. When the worker command is ``python SCRIPT ...`` or ``python -m MODULE ...``
(:func:`~elasticjob.worker_runtime.agents.script_process.warm_start`), the launcher starts one
*start server* for the job (``warm_interpreter.py --serve``, the restart agent's spare
interpreter serving many starts): it imports torch once and forks each worker from itself, so
a worker starts in milliseconds and shares the server's loaded pages. A worker runs as
``python SCRIPT`` would, with its own environment, directory, ``sys.argv``, process session
and standard streams (see ``warm_interpreter.py`` for what differs).

The server is started with the first warm worker's environment less its own variables
(:data:`PER_WORKER_ENV`); a worker whose other variables differ starts cold, as does every
worker once the server failed. ``--no-warm-start`` starts every worker cold.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import signal
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from elasticjob.process_death import die_with
from elasticjob.script_env import HOROVOD_PLACE_ENV
from elasticjob.worker_contract import (
    ENV_BIND_ADDRESS,
    ENV_HOSTNAME,
    ENV_LOCAL_RANK,
    ENV_NODE,
    ENV_TOKEN,
    SCRIPT_LAUNCH_ENV,
)
from elasticjob.worker_runtime.agents.script_process import WARM_INTERPRETER, WarmStart

logger = logging.getLogger(__name__)

PER_WORKER_ENV: Final = frozenset(
    {ENV_TOKEN, ENV_HOSTNAME, ENV_NODE, ENV_LOCAL_RANK, ENV_BIND_ADDRESS}
    | set(SCRIPT_LAUNCH_ENV)
    | set(HOROVOD_PLACE_ENV)
)
"""The variables that differ between two workers of a job: the worker contract's own ones
(its credential, host, slot, address) and the script's place. Nothing reads them when torch is
imported, so a server started without them serves every worker."""

MAX_START_BYTES: Final = 1 << 20
"""The largest start (arguments and environment, as JSON) a server reads; a larger one
starts cold."""


def server_env(worker_env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a start server that may serve a worker with ``worker_env``."""
    return {k: v for k, v in worker_env.items() if k not in PER_WORKER_ENV}


def serves_worker(server: Mapping[str, str], worker_env: Mapping[str, str]) -> bool:
    """Whether a server started with the environment ``server`` may start a worker with
    ``worker_env``: they differ in :data:`PER_WORKER_ENV` only."""
    return server_env(worker_env) == server


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


class StartServer:
    """The job's start server: forks a worker per :meth:`start` (see the module's text)."""

    def __init__(self, warm: WarmStart, env: Mapping[str, str]) -> None:
        self._warm = warm
        self.env = server_env(env)
        """The environment the server was started with."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._process = subprocess.Popen(
                [warm.interpreter, WARM_INTERPRETER, "--serve", str(theirs.fileno())],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=[theirs.fileno()],
                start_new_session=True,
                preexec_fn=die_with(os.getpid()),  # noqa: PLW1509 (the launcher's loop thread)
            )
        finally:
            theirs.close()
        self._channel = ours
        self._ids = itertools.count()
        self._forks: dict[int, asyncio.Future[tuple[int, asyncio.Future[int]]]] = {}
        self._exits: dict[int, asyncio.Future[int]] = {}
        self._ended: str | None = None
        """Why the server can start no more workers (it ended, or was closed)."""
        self._loop = asyncio.get_running_loop()
        ours.setblocking(False)
        self._loop.add_reader(ours.fileno(), self._read)

    def serves(self, warm: WarmStart, env: Mapping[str, str]) -> bool:
        """Whether this server may start a worker that ``warm`` runs with ``env``."""
        return (
            self._ended is None
            and warm.interpreter == self._warm.interpreter
            and serves_worker(self.env, env)
        )

    async def start(self, warm: WarmStart, env: Mapping[str, str], cwd: str) -> StartedWorker:
        """Fork a worker that runs ``warm`` with ``env`` in ``cwd``. Raises :class:`OSError`
        when the server cannot start it (the caller starts it cold)."""
        if self._ended is not None:
            raise OSError(self._ended)
        start_id = next(self._ids)
        start = {"id": start_id, "argv": warm.argv, "module": warm.module, "env": dict(env)}
        message = json.dumps({**start, "cwd": cwd}).encode()
        if len(message) > MAX_START_BYTES:
            raise OSError(f"the worker's start is {len(message)} bytes, over the server's limit")
        stdout_read, stdout_write = os.pipe()
        stderr_read, stderr_write = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        forked: asyncio.Future[tuple[int, asyncio.Future[int]]] = self._loop.create_future()
        self._forks[start_id] = forked
        try:
            socket.send_fds(self._channel, [message], [null, stdout_write, stderr_write])
            pid, exited = await forked
        except BaseException:
            os.close(stdout_read)
            os.close(stderr_read)
            raise
        finally:
            self._forks.pop(start_id, None)
            for fd in (null, stdout_write, stderr_write):
                os.close(fd)
        return StartedWorker(
            pid, await self._reader(stdout_read), await self._reader(stderr_read), exited
        )

    async def _reader(self, fd: int) -> asyncio.StreamReader:
        reader = asyncio.StreamReader(limit=2**16, loop=self._loop)
        pipe = os.fdopen(fd, "rb", buffering=0)
        await self._loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader, loop=self._loop), pipe
        )
        return reader

    def _read(self) -> None:
        """Take the server's answers: a fork's pid or error, a worker's exit."""
        while True:
            try:
                message = self._channel.recv(MAX_START_BYTES)
            except BlockingIOError:
                return
            except OSError:
                message = b""
            if not message:
                self._fail("the start server ended")
                return
            self._answer(json.loads(message))

    def _answer(self, answer: dict[str, Any]) -> None:
        if "exit" in answer:
            exited = self._exits.pop(answer["pid"], None)
            if exited is not None:
                exited.set_result(int(answer["exit"]))
            return
        forked = self._forks.get(answer["id"])
        if forked is None or forked.done():
            return
        if "error" in answer:
            forked.set_exception(OSError(f"the start server could not fork: {answer['error']}"))
            return
        exited = self._loop.create_future()
        self._exits[int(answer["pid"])] = exited
        forked.set_result((int(answer["pid"]), exited))

    def _fail(self, reason: str) -> None:
        """The server is gone: the workers it started died with it (SIGKILL), later starts
        are cold."""
        if self._exits:
            logger.warning("%s: the workers it started are gone", reason)
        self._ended = reason
        self._loop.remove_reader(self._channel.fileno())
        for forked in self._forks.values():
            if not forked.done():
                forked.set_exception(OSError(reason))
        for exited in self._exits.values():
            exited.set_result(-signal.SIGKILL)
        self._exits.clear()

    def close(self) -> None:
        """End the server (its workers, if any are left, die with it)."""
        if self._ended is None:
            self._fail("the start server was closed")
        self._channel.close()
        with contextlib.suppress(ProcessLookupError):
            self._process.kill()
        self._process.wait()
