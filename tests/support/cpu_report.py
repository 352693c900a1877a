"""The CPU each test costs, beside the wall time ``--durations`` reports: on a 2-core machine
running the suites side by side, CPU is what one suite takes from the others.

A test's CPU is that of the pytest process and of every process it started and waited for
(their children too, once reaped): launchers and their workers, CLIs, builds; and that of a
session's process registered with :func:`count_process` and of its reaped children (the
shared start server and the workers it forks); not pods, whose processes are the kubelets'.
The session's most expensive tests are listed at its end, and every test's CPU is written
beside the JUnit XML of a session run with ``--junitxml FILE`` (``FILE`` with the suffix
``.cpu.json``)."""

from __future__ import annotations

import json
import os
import resource
from collections.abc import Generator
from pathlib import Path

import pytest

CPU_SHOWN = 10
"""How many of the most expensive tests a session lists."""

_COST: dict[str, float] = {}
_COUNTED: set[int] = set()
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def count_process(pid: int) -> None:
    """Count ``pid``'s CPU and its reaped children's in the tests that run while it lives."""
    _COUNTED.add(pid)


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + _counted_s()


def _counted_s() -> float:
    """The CPU of the processes :func:`count_process` registered and of their reaped children
    (``/proc/PID/stat``'s utime, stime, cutime and cstime); 0 for one gone (once this
    process reaped it, all of that is in its children's CPU)."""
    ticks = 0
    for pid in _COUNTED:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        ticks += sum(int(f) for f in fields[11:15])
    return ticks * _TICK_S


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    started = _cpu_s()
    try:
        return (yield)
    finally:
        _COST[item.nodeid] = _cpu_s() - started


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _COST:
        return
    junit = terminalreporter.config.option.xmlpath
    if junit:
        costs = dict(sorted(_COST.items(), key=lambda kv: -kv[1]))
        Path(junit).with_suffix(".cpu.json").write_text(json.dumps(costs, indent=1))
    total = sum(_COST.values())
    terminalreporter.write_sep("=", f"most CPU ({total:.0f} CPU-s in all tests)")
    for nodeid, seconds in sorted(_COST.items(), key=lambda kv: -kv[1])[:CPU_SHOWN]:
        terminalreporter.write_line(f"{seconds:7.2f}s cpu  {nodeid}")
