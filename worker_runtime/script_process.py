"""A restart-mode worker's script as a child process of its agent (``restart_agent.py``).

The script runs in a process session of its own, so that stopping it reaches the processes it
started too (data loader workers), as torchrun stops its workers; it dies with its agent
(``PR_SET_PDEATHSIG``). Its standard output is the agent's; its standard error passes through
the agent, which keeps the last lines for the driver's account of a failure.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import BinaryIO

from elasticjob.process_death import die_with

logger = logging.getLogger(__name__)

TAIL_LINES = 20
"""How many of the script's last standard-error lines a failure report carries."""
TAIL_CHARS = 4000
"""At most this many characters of them (the wire's limit is 4096)."""
DRAIN_S = 1.0
"""How long the agent waits for the rest of an ended script's standard error."""


class ScriptProcess:
    """One start of the script: ``command`` with ``env``; ``on_exit`` is called (on a thread
    of this object) once the process has ended and its standard error is drained."""

    def __init__(
        self, command: Sequence[str], env: Mapping[str, str], on_exit: Callable[[], None]
    ) -> None:
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._on_exit = on_exit
        self.stopped = False
        """Whether :meth:`stop` was called: the script did not end on its own."""
        self._process = subprocess.Popen(
            list(command),
            env=dict(env),
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
