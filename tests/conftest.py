"""What every suite shares: the gate between pytest sessions run side by side
(``tests/support/quiet_gate.py``), and Python tracebacks from any process a test starts that
dies of a native fault (SIGABRT, SIGSEGV): a worker's crash names where it happened."""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

from tests.support.quiet_gate import QUIET_MARK, through_gate

os.environ.setdefault("PYTHONFAULTHANDLER", "1")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    """Run each test (setup, call and teardown) through the gate: a ``quiet`` test alone."""
    with through_gate(item.get_closest_marker(QUIET_MARK) is not None):
        return (yield)
