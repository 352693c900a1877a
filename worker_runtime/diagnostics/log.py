"""Log lines prefixed with the job, round, rank and step of the worker that wrote them, and
the stacks of a worker stuck where it should take moments."""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import sys
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

STANDALONE_JOB = "standalone"
"""The job of a process run without a launcher, as its log lines name it."""
STUCK_AFTER_S = 20.0
"""How long a step that takes moments (a rollback, a group's teardown) may last before the
worker writes every thread's stack to stderr (:func:`stacks_if_stuck`)."""


@dataclass
class LogContext:
    """Where the worker is now; updated by the runtime as rounds and steps advance."""

    job: str = STANDALONE_JOB
    round: int = 0
    rank: int = 0
    step: int = 0

    def prefix(self) -> str:
        return f"[{self.job} round={self.round} rank={self.rank} step={self.step}]"


CONTEXT = LogContext()


class _ContextAdapter(logging.LoggerAdapter[logging.Logger]):
    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        return f"{CONTEXT.prefix()} {msg}", kwargs


def get_logger(name: str) -> logging.LoggerAdapter[logging.Logger]:
    """``logging.getLogger(name)``, with every message prefixed by the worker's context."""
    return _ContextAdapter(logging.getLogger(name), {})


@contextlib.contextmanager
def stacks_if_stuck(after_s: float = STUCK_AFTER_S) -> Iterator[None]:
    """Write every thread's stack to stderr if the block (or, as a decorator, each call)
    still runs after ``after_s``: from a native watchdog thread, so even a call that holds
    the GIL is shown. One watch at a time in a process (a nested one replaces it, and ends it
    when it ends)."""
    try:
        fileno = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # stderr replaced by an object without a file
        yield
        return
    faulthandler.dump_traceback_later(after_s, file=fileno)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
