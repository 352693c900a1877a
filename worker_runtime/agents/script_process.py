"""A restart-mode worker's script as a child process of its agent (``restart_agent.py``).

The script runs in a process session of its own, so that stopping it reaches the processes it
started too (data loader workers), as torchrun stops its workers; it dies with its agent
(``PR_SET_PDEATHSIG``). Its standard output is the agent's; its standard error passes through
the agent, which keeps the last lines for the driver's account of a failure.

A start may run in a spare interpreter that was started ahead with torch imported
(``warm_interpreter.py``): :func:`warm_start` says whether the command allows it, a process
started ``held`` waits for :meth:`ScriptProcess.release`.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from elasticjob.process_death import die_with

logger = logging.getLogger(__name__)

TAIL_LINES = 20
"""How many of the script's last standard-error lines a failure report carries."""
TAIL_CHARS = 4000
"""At most this many characters of them (the wire's limit is 4096)."""
DRAIN_S = 1.0
"""How long the agent waits for the rest of an ended script's standard error."""
WARM_INTERPRETER = str(Path(__file__).with_name("warm_interpreter.py"))
"""The program a spare interpreter runs (by path: the script's interpreter may lack
elasticjob)."""
_PYTHON = re.compile(r"python[0-9.]*")


def recorded_error(path: Path) -> str | None:
    """The uncaught exception a script's ``@record`` (torch's ``elastic.multiprocessing.errors``)
    wrote to ``path`` (``TORCHELASTIC_ERROR_FILE``): its traceback, else its message, at
    most :data:`TAIL_CHARS` of the end; None without a readable record."""
    try:
        record = json.loads(path.read_text())
        message = record["message"]
        text = message.get("extraInfo", {}).get("py_callstack") or message["message"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return str(text)[-TAIL_CHARS:] if text else None


@dataclass(frozen=True)
class WarmStart:
    """How a spare interpreter runs a command."""

    interpreter: str
    """The command's interpreter, which the spare is started with."""
    argv: tuple[str, ...]
    """The script's ``sys.argv`` (for ``-m``: the module's name first, which ``runpy``
    replaces with its file, as ``python -m`` does)."""
    module: str | None
    """The module of ``python -m MODULE``; None: ``argv[0]`` is the script's path."""


def warm_start(command: Sequence[str]) -> WarmStart | None:
    """How a spare interpreter would run ``command``: ``python SCRIPT ARGS...`` or ``python
    -m MODULE ARGS...`` (any ``python*`` interpreter, no other interpreter option). None for
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


class ScriptProcess:
    """One start of the script: ``command`` with ``env``; ``on_exit`` is called (on a thread
    of this object) once the process has ended and its standard error is drained."""

    def __init__(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        on_exit: Callable[[], None],
        *,
        held: bool = False,
    ) -> None:
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._on_exit = on_exit
        self.stopped = False
        """Whether :meth:`stop` was called: the script did not end on its own."""
        self._process = subprocess.Popen(
            list(command),
            env=dict(env),
            stdin=subprocess.PIPE if held else None,
            stderr=subprocess.PIPE,
            start_new_session=True,
            # Safe with threads: the hook makes one foreign call (prctl), which takes no lock.
            preexec_fn=die_with(os.getpid()) if sys.platform == "linux" else None,  # noqa: PLW1509
        )
        assert self._process.stderr is not None
        self._drain = threading.Thread(
            target=self._pass_stderr,
            args=(self._process.stderr,),
            name="elasticjob-script-stderr",
            daemon=True,
        )
        self._drain.start()
        threading.Thread(target=self._await_exit, name="elasticjob-script", daemon=True).start()

    @classmethod
    def spare(cls, start: WarmStart, env: Mapping[str, str]) -> ScriptProcess:
        """A spare interpreter for ``start``'s interpreter, started with ``env``: it imports
        torch and waits for :meth:`release`."""
        return cls([start.interpreter, WARM_INTERPRETER], env, lambda: None, held=True)

    @property
    def pid(self) -> int:
        return self._process.pid

    def release(
        self, start: WarmStart, env: Mapping[str, str], on_exit: Callable[[], None]
    ) -> bool:
        """Run ``start`` with ``env`` (in this directory) in this spare interpreter;
        ``on_exit`` is called once it ends. False: the spare had ended (start cold)."""
        stdin = self._process.stdin
        if stdin is None or self._process.poll() is not None:
            return False
        self._on_exit = on_exit
        fields = {"argv": start.argv, "env": dict(env), "cwd": os.getcwd(), "module": start.module}
        handle, path = tempfile.mkstemp(prefix="elasticjob-start-", suffix=".json")
        with os.fdopen(handle, "w") as out:
            json.dump(fields, out)
        try:
            stdin.write(path.encode() + b"\n")
            stdin.close()
        except OSError:  # it ended meanwhile
            os.unlink(path)
            return False
        return True

    def discard(self) -> None:
        """End a spare interpreter that was not released."""
        if self._process.stdin is not None:
            with contextlib.suppress(OSError):
                self._process.stdin.close()  # it reads the end of its input and ends
        self.stop(DRAIN_S)

    @property
    def returncode(self) -> int | None:
        """The process's return code once it ended (negative: the signal that killed it)."""
        return self._process.poll()

    def log_tail(self) -> str:
        """The last lines the script wrote to standard error."""
        return "".join(self._tail)[-TAIL_CHARS:]

    def stop(self, grace_s: float) -> int:
        """Stop the script's session: SIGTERM, then SIGKILL after ``grace_s``; return its
        return code."""
        self.stopped = True
        if self._process.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                return self._process.wait(grace_s)
            except subprocess.TimeoutExpired:
                logger.warning(
                    "the script did not stop within %.0f s of SIGTERM: killing it", grace_s
                )
        self._signal(signal.SIGKILL)
        return self._process.wait()

    def _signal(self, signum: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):  # the session has no process left
            os.killpg(self._process.pid, signum)

    def _pass_stderr(self, stream: BinaryIO) -> None:
        out = sys.stderr.buffer
        for line in iter(stream.readline, b""):
            out.write(line)
            out.flush()
            self._tail.append(line.decode(errors="replace"))
        stream.close()

    def _await_exit(self) -> None:
        """Once the script ended: end what is left of its session (a process it started
        would hold its standard error open), let its last lines through, tell the agent."""
        self._process.wait()
        self._signal(signal.SIGKILL)
        self._drain.join(DRAIN_S)
        self._on_exit()
