"""The gate between side-by-side pytest sessions (``tests/support/quiet_gate.py``): a quiet
test waits for the tests under way, then runs alone; tests that come meanwhile wait for it."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.support.quiet_gate import GATE_ENV, GateKeeper, through_gate

WITHIN_S = 10.0
BLOCKED_S = 0.3
"""How long a thread that must be held at the gate is watched not to pass."""


def test_a_quiet_test_runs_alone_and_is_not_starved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(GATE_ENV, str(tmp_path / "gate"))
    order: list[str] = []
    inside = {name: threading.Event() for name in ("other", "quiet", "late")}
    leave = {name: threading.Event() for name in ("other", "quiet", "late")}

    def test(name: str, quiet: bool) -> None:
        with through_gate(quiet):
            order.append(f"{name} in")
            inside[name].set()
            assert leave[name].wait(WITHIN_S)
            order.append(f"{name} out")

    threads = {
        "other": threading.Thread(target=test, args=("other", False)),
        "quiet": threading.Thread(target=test, args=("quiet", True)),
        "late": threading.Thread(target=test, args=("late", False)),
    }
    threads["other"].start()
    assert inside["other"].wait(WITHIN_S)
    threads["quiet"].start()
    assert not inside["quiet"].wait(BLOCKED_S), "a quiet test waits for the tests under way"
    threads["late"].start()
    assert not inside["late"].wait(BLOCKED_S), "a test that comes meanwhile waits too"
    leave["other"].set()
    assert inside["quiet"].wait(WITHIN_S)
    assert not inside["late"].wait(BLOCKED_S), "nobody runs beside a quiet test"
    leave["quiet"].set()
    assert inside["late"].wait(WITHIN_S)
    leave["late"].set()
    for thread in threads.values():
        thread.join(WITHIN_S)
    assert order == ["other in", "other out", "quiet in", "quiet out", "late in", "late out"]


def test_consecutive_quiet_tests_keep_the_gate_between_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(GATE_ENV, str(tmp_path / "gate"))
    keeper = GateKeeper()
    other_in = threading.Event()

    def other() -> None:
        with through_gate(quiet=False):
            other_in.set()

    with keeper.test(quiet=True, next_quiet=True):
        waiting = threading.Thread(target=other)
        waiting.start()
    assert not other_in.wait(BLOCKED_S), "the gate was let go between two quiet tests"
    with keeper.test(quiet=True, next_quiet=False):
        assert not other_in.wait(BLOCKED_S), "somebody ran beside the second quiet test"
    assert other_in.wait(WITHIN_S), "the gate was kept after the last quiet test"
    waiting.join(WITHIN_S)
    with keeper.test(quiet=False, next_quiet=False), through_gate(quiet=False):
        pass  # an ordinary test shares the gate


def test_without_a_gate_nobody_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(GATE_ENV, raising=False)
    with through_gate(True), through_gate(True):
        pass
