"""A gate between pytest sessions that run side by side on one machine (``make test``): a
test marked ``quiet`` runs while the other sessions' tests wait, because what it checks
depends on the machine's load (relative speeds, a heartbeat timeout of a few seconds); every
other test takes the gate shared, so a quiet test waits only for the tests under way.

Two ``flock`` files under the directory named by :data:`GATE_ENV`: ``turn``, taken briefly by
every test before it enters, so that a waiting quiet test is not starved by tests that keep
entering, and ``room``, held shared by a test while it runs and exclusively by a quiet test.
Without :data:`GATE_ENV` (one session) tests do not wait.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Final

GATE_ENV: Final = "ELASTICJOB_QUIET_GATE"
QUIET_MARK: Final = "quiet"


@contextlib.contextmanager
def _locked(path: Path, operation: int) -> Iterator[None]:
    with path.open("a") as file:
        fcntl.flock(file, operation)
        try:
            yield
        finally:
            fcntl.flock(file, fcntl.LOCK_UN)


@contextlib.contextmanager
def through_gate(quiet: bool) -> Iterator[None]:
    """Hold the gate while a test runs: exclusively for a quiet test, shared for any other."""
    gate = os.environ.get(GATE_ENV)
    if not gate:
        yield
        return
    directory = Path(gate)
    directory.mkdir(parents=True, exist_ok=True)
    room = fcntl.LOCK_EX if quiet else fcntl.LOCK_SH
    with contextlib.ExitStack() as held:
        with _locked(directory / "turn", fcntl.LOCK_EX):
            held.enter_context(_locked(directory / "room", room))
        yield


class GateKeeper:
    """Takes each test of a session through the gate, holding it exclusively from the first of
    consecutive quiet tests to the end of the last: they wait for the tests under way once,
    not once each."""

    def __init__(self) -> None:
        self._quiet_run: contextlib.ExitStack | None = None

    @contextlib.contextmanager
    def test(self, *, quiet: bool, next_quiet: bool) -> Iterator[None]:
        """Hold the gate for one test; ``next_quiet`` says whether the session's next test
        is quiet too (the gate is then kept for it)."""
        if not quiet:
            with through_gate(quiet=False):
                yield
            return
        if self._quiet_run is None:
            self._quiet_run = contextlib.ExitStack()
            self._quiet_run.enter_context(through_gate(quiet=True))
        try:
            yield
        finally:
            if not next_quiet:
                self._quiet_run.close()
                self._quiet_run = None
