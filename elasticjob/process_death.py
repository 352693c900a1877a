"""A child process that dies with its parent, on Linux: the kernel sends it SIGKILL when the
parent dies, even by SIGKILL (``PR_SET_PDEATHSIG``). ``elasticjob-run`` starts its workers so,
and a restart-mode agent its script."""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def die_with(parent_pid: int) -> Callable[[], None]:
    """A ``preexec_fn`` that makes the child receive SIGKILL when ``parent_pid`` dies.

    The kernel sends it when the *thread* that forked the child exits: fork from a thread
    that lives as long as the parent (the launcher's event loop, the agent's main thread)."""
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec() -> None:
        if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            os._exit(126)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(126)

    return preexec
