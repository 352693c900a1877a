"""The processes of a pod's slots, for its slot supervisor (``slot_supervisor.py``): each
start's pid and the order in which they end, whether a start is a fresh interpreter or forked
from a *start server* (an interpreter with torch imported, ``start_server.py``).

A slot restarted in place (its pod lives on, and the job's driver has it start again) holds
up the other ranks until its process joins them, and ``import torch`` is most of a fresh
process's start. A pod whose command allows warm starts therefore keeps a start server, and
a restarted slot is forked from it: its first line runs in milliseconds. The slots' first
starts are fresh interpreters, as without it, and the server starts a while after them
(``WorkerConfig.start_server_after_s``), so that its imports do not slow theirs down where
the pod has few cores (a slot restarted before then starts cold). Torch-free.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence

from elasticjob.worker_runtime.agents.start_server import StartServer, WarmStart

logger = logging.getLogger(__name__)

_START_SERVER = -1
"""Not a start: the time to start the start server has come."""


class SlotProcesses:
    """The slots' processes of one pod, run with ``envs[slot]`` (which differ in the slot's
    launch variables only); ``warm``: how a start server runs the command, started
    ``server_after_s`` from now (None: every start is a fresh interpreter)."""

    def __init__(
        self,
        command: Sequence[str],
        envs: Sequence[Mapping[str, str]],
        warm: WarmStart | None,
        server_after_s: float,
    ) -> None:
        self._command = list(command)
        self._envs = [dict(env) for env in envs]
        self._ends: queue.SimpleQueue[tuple[int, int]] = queue.SimpleQueue()
        self._ids = itertools.count()
        self._running: dict[int, tuple[int, int]] = {}
        """Each running start's slot and pid, by start."""
        self._warm = warm
        self._server: StartServer | None = None
        """The start server, once started."""
        if warm is not None:
            # Started on the caller's thread (at its wait for an end), which lives as long as
            # the pod: the server dies with the thread that started it (PR_SET_PDEATHSIG).
            timer = threading.Timer(server_after_s, self._ends.put, ((_START_SERVER, 0),))
            timer.daemon = True
            timer.start()

    def _start_server(self) -> None:
        assert self._warm is not None
        try:
            self._server = StartServer(self._warm, self._envs[0], self._server_ready)
        except OSError as exc:  # the pod's process or memory limit
            logger.warning("no start server (%s): a restarted slot starts cold", exc)

    def __bool__(self) -> bool:
        """Whether a slot's process still runs."""
        return bool(self._running)

    @staticmethod
    def _server_ready() -> None:
        logger.info("the start server is ready (torch imported)")

    def start(self, slot: int, *, restart: bool = False) -> None:
        """Start ``slot``'s process: a ``restart`` forked from the start server where there is
        one, else (and for a first start) a fresh interpreter."""
        start = next(self._ids)
        pid = self._forked(start, slot) if restart else None
        if pid is None:
            process = subprocess.Popen(self._command, env=self._envs[slot])
            waiter = threading.Thread(
                target=lambda: self._ends.put((start, process.wait())), daemon=True
            )
            waiter.start()
            pid = process.pid
        self._running[start] = (slot, pid)

    def _forked(self, start: int, slot: int) -> int | None:
        if self._server is None:
            return None
        stdio = [os.open(os.devnull, os.O_RDONLY), os.dup(1), os.dup(2)]
        try:
            pid = self._server.start(
                self._envs[slot], os.getcwd(), stdio, lambda code: self._ends.put((start, code))
            )
        except OSError as exc:
            logger.warning("slot %d starts cold: %s", slot, exc)
            return None
        finally:
            for fd in stdio:
                os.close(fd)
        logger.info("slot %d starts forked from the start server (torch imported)", slot)
        return pid

    def next_end(self) -> tuple[int, int]:
        """Wait for a slot's process to end: its slot and exit code (negative: the signal
        that ended it)."""
        start, code = self._ends.get()
        while start == _START_SERVER:
            self._start_server()
            start, code = self._ends.get()
        slot, _ = self._running.pop(start)
        return slot, code

    def send(self, signum: int) -> None:
        """Send ``signum`` to every running slot's process."""
        for _, pid in self._running.values():
            with contextlib.suppress(ProcessLookupError):  # it ended; its end is on its way
                os.kill(pid, signum)

    def kill(self) -> None:
        """SIGKILL every running slot's process."""
        self.send(signal.SIGKILL)
