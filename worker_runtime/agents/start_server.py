"""Warm starts: a Python command forked from a *start server*, an interpreter with torch
imported (``warm_interpreter.py``).

A torch script spends seconds before its first line runs (the interpreter, ``import torch``,
``torch._dynamo`` once it makes an optimizer). A start server pays them once: it is started
with the command's interpreter and environment, imports torch, and forks every start of the
command from itself, so a start runs its first line in milliseconds and shares the server's
loaded pages. ``elasticjob-run`` keeps one per job for its workers, or uses a shared one that
serves jobs one after another (``elasticjob/launcher/warm_workers.py``); a restart-mode agent
keeps one for its script's starts (``restart_agent.py``).

:func:`warm_start` says whether a command may start so; :class:`StartServer` is the client,
safe to use from any thread: :meth:`StartServer.start` forks a start and returns its pid, and
a callback hears its exit code. Torch-free.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from elasticjob.process_death import die_with

logger = logging.getLogger(__name__)

WARM_INTERPRETER: Final = str(Path(__file__).with_name("warm_interpreter.py"))
"""The program a start server runs (by path: the command's interpreter may lack
elasticjob)."""
_ANSWER_BYTES = 4096
CONNECT_TIMEOUT_S: Final = 10.0
"""How long connecting to a shared server waits for its greeting."""
FORK_TIMEOUT_S: Final = 120.0
"""How long a start waits for the server to fork it (the first waits for its imports)."""
_PYTHON = re.compile(r"python[0-9.]*")


@dataclass(frozen=True)
class WarmStart:
    """How a start server runs a command."""

    interpreter: str
    """The command's interpreter, which the server is started with."""
    argv: tuple[str, ...]
    """The script's ``sys.argv`` (for ``-m``: the module's name first, which ``runpy``
    replaces with its file, as ``python -m`` does)."""
    module: str | None
    """The module of ``python -m MODULE``; None: ``argv[0]`` is the script's path."""


def warm_start(command: Sequence[str]) -> WarmStart | None:
    """How a start server would run ``command``: ``python SCRIPT ARGS...`` or ``python -m
    MODULE ARGS...`` (any ``python*`` interpreter, no other interpreter option). None for
    anything else, which always starts cold (a shell, ``python -u``, ``python -c``)."""
    if len(command) < 2 or not _PYTHON.fullmatch(os.path.basename(command[0])):
        return None
    if command[1] == "-m":
        if len(command) < 3 or command[2].startswith("-"):
            return None
        return WarmStart(command[0], tuple(command[2:]), command[2])
    if command[1].startswith("-"):
        return None
    return WarmStart(command[0], tuple(command[1:]), None)


def same_interpreter(python: str, interpreter: str, path: str) -> bool:
    """Whether ``python`` (an absolute path) runs as ``interpreter`` found on ``path``: the
    same program in the same folder (a virtual environment's own ``python`` and ``python3``
    are links to one program; another environment's are in another folder)."""
    found = shutil.which(interpreter, path=path)
    return found is not None and (
        os.path.dirname(os.path.abspath(found)) == os.path.dirname(python)
        and os.path.realpath(found) == os.path.realpath(python)
    )


def serves(
    server_env: Mapping[str, str], start_env: Mapping[str, str], varying: AbstractSet[str]
) -> bool:
    """Whether a server started with ``server_env`` may fork a start whose environment is
    ``start_env``: they differ in the ``varying`` variables only, which nothing may read at
    import (a worker's or a start's place in the job)."""
    return not differing(server_env, start_env, varying)


def differing(
    server_env: Mapping[str, str], start_env: Mapping[str, str], varying: AbstractSet[str]
) -> list[str]:
    """The variables other than ``varying`` in which ``start_env`` differs from
    ``server_env``, sorted (none: the server :func:`serves` the start)."""
    keys = server_env.keys() | start_env.keys()
    return sorted(k for k in keys - varying if server_env.get(k) != start_env.get(k))


@dataclass
class _Fork:
    """A start waiting for its fork."""

    on_exit: Callable[[int], object]
    forked: threading.Event = field(default_factory=threading.Event)
    pid: int | None = None
    error: str | None = None


class StartServer:
    """A start server for ``warm``'s command, started with ``env`` (its starts may differ
    from it only in what nothing reads at import: the caller's rule). It dies with this
    process (``PR_SET_PDEATHSIG``), and its starts die with it.

    :meth:`connect` is the client of a *shared* server instead (``warm_interpreter.py
    --listen``), one that outlives its clients: this process's starts die when it goes."""

    def __init__(
        self,
        warm: WarmStart,
        env: Mapping[str, str],
        on_ready: Callable[[], object] = lambda: None,
    ) -> None:
        """``on_ready`` is called (on a thread of this object) once the server has imported
        torch and serves."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            process: subprocess.Popen[bytes] | None = subprocess.Popen(
                [warm.interpreter, WARM_INTERPRETER, "--serve", str(theirs.fileno())],
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=[theirs.fileno()],
                start_new_session=True,
                # Safe with threads: the hook makes one foreign call (prctl), which takes no lock.
                preexec_fn=die_with(os.getpid()),  # noqa: PLW1509
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._follow(warm, env, ours, process, on_ready)

    @classmethod
    def connect(cls, path: str, warm: WarmStart) -> StartServer:
        """The client of the shared server listening at ``path``. Raises :class:`OSError`
        when none answers there, or when it runs another interpreter than ``warm``'s."""
        channel = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            channel.settimeout(CONNECT_TIMEOUT_S)
            channel.connect(path)
            hello, fds, _, _ = socket.recv_fds(channel, _ANSWER_BYTES, 1)
            if not fds:
                raise OSError(f"no start server at {path}")
            with os.fdopen(fds[0], "rb") as env_file:
                env_file.seek(0)
                env = json.loads(env_file.read())
            python = json.loads(hello)["python"]
            if not same_interpreter(python, warm.interpreter, env.get("PATH", os.defpath)):
                raise OSError(f"the start server at {path} runs {python}, not {warm.interpreter}")
            channel.settimeout(None)
        except BaseException:
            channel.close()
            raise
        server = cls.__new__(cls)
        server._follow(warm, env, channel, None, lambda: None)  # it greeted: ready
        return server

    def _follow(
        self,
        warm: WarmStart,
        env: Mapping[str, str],
        channel: socket.socket,
        process: subprocess.Popen[bytes] | None,
        on_ready: Callable[[], object],
    ) -> None:
        self._warm = warm
        self._on_ready = on_ready
        self.env = dict(env)
        """The environment the server was started with."""
        self.shared = process is None
        """Whether the server is shared (:meth:`connect`), not this process's own."""
        self._channel = channel
        self._process = process
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._forks: dict[int, _Fork] = {}
        self._exits: dict[int, Callable[[int], object]] = {}
        self._ended: str | None = None
        threading.Thread(target=self._read, name="elasticjob-start-server", daemon=True).start()

    def start(
        self,
        env: Mapping[str, str],
        cwd: str,
        stdio: Sequence[int],
        on_exit: Callable[[int], object],
    ) -> int:
        """Fork a start of the server's command with ``env`` in ``cwd``, its standard input, output
        and error the descriptors ``stdio`` (the caller closes its copies); return its pid.
        ``on_exit`` hears its exit code (negative: the signal that ended it; SIGKILL when the
        server died), on a thread of this object. Raises :class:`OSError` when the server
        cannot start it (start it cold)."""
        warm = self._warm
        start = {"argv": warm.argv, "module": warm.module, "env": dict(env), "cwd": cwd}
        fork = _Fork(on_exit)
        with self._lock:
            if self._ended is not None:
                raise OSError(self._ended)
            start_id = next(self._ids)
            self._forks[start_id] = fork
        # The start travels as a file (an environment can outgrow a socket's buffer).
        start_file = os.memfd_create("elasticjob-start", os.MFD_CLOEXEC)
        try:
            os.write(start_file, json.dumps(start).encode())
            message = json.dumps({"id": start_id}).encode()
            socket.send_fds(self._channel, [message], [*stdio, start_file])
            if not fork.forked.wait(FORK_TIMEOUT_S):
                raise OSError(f"the start server did not fork within {FORK_TIMEOUT_S:.0f} s")
        finally:
            os.close(start_file)
            with self._lock:
                self._forks.pop(start_id, None)
        if fork.pid is None:
            raise OSError(fork.error)
        return fork.pid

    def _read(self) -> None:
        """Take the server's answers, until its end: a fork's pid or error, a start's end."""
        while True:
            try:
                message = self._channel.recv(_ANSWER_BYTES)
            except OSError:
                message = b""
            if not message:
                self._end("the start server ended")
                self._channel.close()
                return
            self._answer(json.loads(message))

    def _answer(self, answer: dict[str, Any]) -> None:
        if answer.get("ready"):
            self._on_ready()
            return
        with self._lock:
            if "exit" in answer:
                on_exit = self._exits.pop(answer["pid"], None)
            else:
                on_exit = None
                fork = self._forks.get(answer["id"])
                if fork is not None:
                    fork.pid, fork.error = answer.get("pid"), answer.get("error")
                    if fork.pid is not None:
                        self._exits[fork.pid] = fork.on_exit
                    fork.forked.set()
        if on_exit is not None:
            on_exit(int(answer["exit"]))

    def _end(self, reason: str) -> None:
        """The server is gone: its starts died with it (SIGKILL); no more starts."""
        with self._lock:
            if self._ended is None:
                self._ended = reason
            exits, self._exits = self._exits, {}
            for fork in self._forks.values():
                fork.error = self._ended
                fork.forked.set()
        if exits:
            logger.warning("%s: the starts it forked are gone", reason)
        for on_exit in exits.values():
            on_exit(-signal.SIGKILL)

    def close(self) -> None:
        """End the server (a shared one: this client); a start still running ends with it."""
        with self._lock:
            if self._ended is None:
                self._ended = "the start server was closed"
        with contextlib.suppress(OSError):
            self._channel.shutdown(socket.SHUT_RDWR)  # its reader sees the end
        if self._process is not None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()
            self._process.wait()
