"""What every suite shares: the gate between pytest sessions run side by side
(``tests/support/quiet_gate.py``), the CPU each test costs (``tests/support/cpu_report.py``),
and Python tracebacks from any process a test starts that
dies of a native fault (SIGABRT, SIGSEGV): a worker's crash names where it happened."""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

from tests.support.quiet_gate import QUIET_MARK, GateKeeper

os.environ.setdefault("PYTHONFAULTHANDLER", "1")

pytest_plugins = ["tests.support.cpu_report"]


_GATE = GateKeeper()


def _quiet(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker(QUIET_MARK) is not None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    """Run each test (setup, call and teardown) through the gate: consecutive ``quiet`` tests
    alone, together."""
    with _GATE.test(quiet=_quiet(item), next_quiet=_quiet(nextitem)):
        return (yield)
