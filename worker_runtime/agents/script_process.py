"""A restart-mode worker's script as a child process of its agent (``restart_agent.py``).

The script runs in a process session of its own, so that stopping it reaches the processes it
started too (data loader workers), as torchrun stops its workers; it dies with its agent
(``PR_SET_PDEATHSIG``). Its standard output is the agent's; its standard error passes through
the agent, which keeps the last lines for the driver's account of a failure.

A start is started cold (:meth:`ScriptProcess.cold`) or forked from the agent's start server,
where torch is imported already (:meth:`ScriptProcess.forked`, ``start_server.py``).
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from elasticjob.process_death import die_with
from elasticjob.worker_runtime.agents.start_server import StartServer

logger = logging.getLogger(__name__)

TAIL_LINES = 20
"""How many of the script's last standard-error lines a failure report carries."""
TAIL_CHARS = 4000
"""At most this many characters of them (the wire's limit is 4096)."""
DRAIN_S = 1.0
"""How long the agent waits for the rest of an ended script's standard error."""


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


class _Forked:
    """A start forked from a start server: what the agent uses of :class:`subprocess.Popen`."""

    def __init__(self, stderr: BinaryIO) -> None:
        self.pid = 0
        self.stderr: BinaryIO | None = stderr
        self._returncode: int | None = None
        self._ended = threading.Event()

    def ended(self, returncode: int) -> None:
        """The server said the start ended (called on the server client's thread)."""
        self._returncode = returncode
        self._ended.set()

    def poll(self) -> int | None:
        return self._returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        assert self._returncode is not None
        return self._returncode


class ScriptProcess:
    """One start of the script; ``on_exit`` is called (on a thread of this object) once the
    process has ended and its standard error is drained."""

    def __init__(
        self, process: subprocess.Popen[bytes] | _Forked, on_exit: Callable[[], None]
    ) -> None:
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._on_exit = on_exit
        self.stopped = False
        """Whether :meth:`stop` was called: the script did not end on its own."""
        self._process = process
        assert process.stderr is not None
        self._drain = threading.Thread(
            target=self._pass_stderr,
            args=(process.stderr,),
            name="elasticjob-script-stderr",
            daemon=True,
        )
        self._drain.start()
        threading.Thread(target=self._await_exit, name="elasticjob-script", daemon=True).start()

    @classmethod
    def cold(
        cls, command: Sequence[str], env: Mapping[str, str], on_exit: Callable[[], None]
    ) -> ScriptProcess:
        """``command`` started with ``env`` in a fresh process."""
        process = subprocess.Popen(
            list(command),
            env=dict(env),
            stderr=subprocess.PIPE,
            start_new_session=True,
            # Safe with threads: the hook makes one foreign call (prctl), which takes no lock.
            preexec_fn=die_with(os.getpid()) if sys.platform == "linux" else None,  # noqa: PLW1509
        )
        return cls(process, on_exit)

    @classmethod
    def forked(
        cls,
        server: StartServer,
        env: Mapping[str, str],
        on_exit: Callable[[], None],
    ) -> ScriptProcess:
        """``server``'s command forked with ``env``, in this directory, with this
        process's standard input and output. Raises :class:`OSError` when the server cannot
        start it."""
        stderr_read, stderr_write = os.pipe()
        process = _Forked(os.fdopen(stderr_read, "rb"))
        try:
            process.pid = server.start(env, os.getcwd(), (0, 1, stderr_write), process.ended)
        except BaseException:
            assert process.stderr is not None
            process.stderr.close()
            raise
        finally:
            os.close(stderr_write)
        return cls(process, on_exit)

    @property
    def pid(self) -> int:
        return self._process.pid

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
