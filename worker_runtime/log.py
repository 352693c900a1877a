"""Log lines prefixed with the job, round, rank and step of the worker that wrote them."""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

STANDALONE_JOB = "standalone"
"""The job of a process run without a launcher, as its log lines name it."""


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
