"""Threads that may still be inside native code after the runtime let go of their work: a
closed negotiation's thread in a store call, a broken group's teardown waiting out its
backend's threads. The interpreter must not tear down under them (a native destructor that
finds a joinable thread aborts the process), so a leaving process waits for them
(:func:`settle`) and, when they outlast the wait, leaves without native teardown."""

from __future__ import annotations

import logging
import threading
import time

logger = logging.getLogger(__name__)

SETTLE_S = 5.0
"""How long a leaving process waits for lingering threads to end."""

_threads: list[threading.Thread] = []
_lock = threading.Lock()


def track(*threads: threading.Thread) -> None:
    """Count ``threads`` (started already) as lingering until they end."""
    with _lock:
        _threads.extend(threads)


def settle(timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for every lingering thread to end; whether all did."""
    deadline = time.monotonic() + timeout_s
    with _lock:
        threads = list(_threads)
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    with _lock:
        _threads[:] = [thread for thread in _threads if thread.is_alive()]
        left = [thread.name for thread in _threads]
    if left and timeout_s > 0:
        logger.warning("after %.1f s, threads still in native code: %s", timeout_s, left)
    return not left
