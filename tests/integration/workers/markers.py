"""Marker files through which the test worker scripts order one rank's scripted fault after
what its peers must have done first (run by path, the scripts import it from their own
directory)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path


def await_markers(markers: Iterable[Path], within_s: float) -> bool:
    """Wait until every file of ``markers`` exists, for ``within_s`` at most; return whether
    they all did."""
    wanted = list(markers)
    deadline = time.monotonic() + within_s
    while not all(m.exists() for m in wanted):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True
