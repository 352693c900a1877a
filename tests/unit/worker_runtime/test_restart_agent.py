"""The restart agent's decisions (which notice stops the script and whether it counts as a
restart; what follows an attempt; the script's environment) and its script process (a real
child: stopped with what it started, its return code, its last lines)."""

from __future__ import annotations

import json
import os
import select
import sys
import threading
from pathlib import Path

import pytest

from elasticjob.wire.messages import Notice, NoticeKind, ScriptExit
from elasticjob.worker_contract import ENV_RENDEZVOUS_URL, ENV_TOKEN
from elasticjob.worker_runtime.agents.restart_agent import (
    Attempt,
    Cause,
    NextStep,
    after_attempt,
    restart_cause,
    script_environ,
)
from elasticjob.worker_runtime.agents.script_process import (
    TAIL_CHARS,
    TAIL_LINES,
    ScriptProcess,
    recorded_error,
)

ENDED_WITHIN_S = 30.0


def notice(seq: int, kind: NoticeKind, round_number: int) -> Notice:
    return Notice(seq=seq, kind=kind, round=round_number, hosts=("h",))


@pytest.mark.parametrize(
    ("seen", "expected"),
    [
        pytest.param(notice(5, NoticeKind.ROUND_FAILED, 3), Cause.FAILURE, id="round-failed"),
        pytest.param(notice(5, NoticeKind.HOSTS_ADDED, 3), Cause.HOSTS, id="hosts-added"),
        pytest.param(notice(5, NoticeKind.HOSTS_REMOVED, 3), Cause.HOSTS, id="hosts-leaving"),
        pytest.param(notice(5, NoticeKind.SUSPEND, 3), Cause.SUSPEND, id="suspend"),
        pytest.param(notice(4, NoticeKind.SUSPEND, 2), None, id="suspend-accounted-for"),
        pytest.param(notice(4, NoticeKind.HOSTS_ADDED, 2), None, id="posted-before-the-round"),
        pytest.param(notice(5, NoticeKind.ROUND_FAILED, 2), None, id="another-rounds-failure"),
        pytest.param(notice(3, NoticeKind.ROUND_FAILED, 3), None, id="accounted-for"),
    ],
)
def test_restart_cause(seen: Notice, expected: Cause | None) -> None:
    """The script of round 3, published when the notices were at 4."""
    assert restart_cause(seen, 3, 4) is expected


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [
        pytest.param(Attempt(0), NextStep(0), id="succeeded-exits-0"),
        pytest.param(
            Attempt(3, log_tail="boom"),
            NextStep(None, ScriptExit(exit_code=3, log_tail="boom"), counts_restart=True),
            id="failed-tells-the-driver",
        ),
        pytest.param(
            Attempt(-9),
            NextStep(None, ScriptExit(exit_code=-9), counts_restart=True),
            id="killed-by-someone-else-tells-the-driver",
        ),
        pytest.param(
            Attempt(None, Cause.FAILURE),
            NextStep(None, counts_restart=True),
            id="stopped-for-a-failure-counts",
        ),
        pytest.param(Attempt(None, Cause.HOSTS), NextStep(None), id="stopped-for-hosts"),
        pytest.param(
            Attempt(None, Cause.SUSPEND), NextStep(None, suspended=True), id="stopped-for-suspend"
        ),
        pytest.param(Attempt(None), NextStep(None), id="stopped-by-sigterm"),
    ],
)
def test_after_attempt(attempt: Attempt, expected: NextStep) -> None:
    assert after_attempt(attempt) == expected


def test_the_script_gets_no_worker_contract_variable() -> None:
    """Its token least of all: the script is no worker of the rendezvous."""
    env = script_environ(
        {ENV_TOKEN: "secret", ENV_RENDEZVOUS_URL: "http://x", "PATH": "/bin", "RANK": "9"},
        {"RANK": "1"},
    )
    assert env == {"PATH": "/bin", "RANK": "1"}


def run_script(code: str) -> tuple[ScriptProcess, threading.Event]:
    ended = threading.Event()
    script = ScriptProcess([sys.executable, "-c", code], dict(os.environ), ended.set)
    return script, ended


def test_a_script_that_fails_leaves_its_code_and_last_lines() -> None:
    lines = "".join(f"print('line {i}', file=sys.stderr); " for i in range(TAIL_LINES + 5))
    script, ended = run_script(f"import sys; {lines}sys.exit(7)")
    assert ended.wait(ENDED_WITHIN_S)
    assert script.returncode == 7 and not script.stopped
    tail = script.log_tail().splitlines()
    assert tail[0] == "line 5" and tail[-1] == f"line {TAIL_LINES + 4}"


def test_stopping_a_script_ends_what_it_started(tmp_path: Path) -> None:
    """A process the script started (a data loader's worker) ends with it, as under
    torchrun, even one that ignores SIGTERM."""
    fifo = tmp_path / "grandchild"
    os.mkfifo(fifo)
    code = (
        "import subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)']); "
        f"open({str(fifo)!r}, 'w').write(str(child.pid)); time.sleep(600)"
    )
    script, ended = run_script(code)
    with fifo.open() as started:  # blocks until the script has started its child
        grandchild = os.pidfd_open(int(started.read()))
    try:
        assert script.stop(grace_s=5.0) == -15
        assert ended.wait(ENDED_WITHIN_S) and script.stopped
        readable, _, _ = select.select([grandchild], [], [], ENDED_WITHIN_S)
        assert readable, "the script's child outlived it"
    finally:
        os.close(grandchild)


def record_of(message: str, callstack: str | None = None) -> str:
    """What torch's ``@record`` writes (``ErrorHandler.record_exception``)."""
    extra = {} if callstack is None else {"extraInfo": {"py_callstack": callstack}}
    return json.dumps({"message": {"message": message, **extra}})


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        pytest.param(None, None, id="no-file"),
        pytest.param("not json", None, id="unreadable"),
        pytest.param('{"other": 1}', None, id="no-message"),
        pytest.param(
            record_of("ValueError: x", "Tb\nValueError: x"),
            "Tb\nValueError: x",
            id="record-writes-its-traceback",
        ),
        pytest.param(record_of("ValueError: x"), "ValueError: x", id="message-only"),
        pytest.param(record_of("E", "a" * 5000), "a" * TAIL_CHARS, id="the-end-of-a-long-one"),
    ],
)
def test_recorded_error(tmp_path: Path, content: str | None, expected: str | None) -> None:
    path = tmp_path / "error.json"
    if content is not None:
        path.write_text(content)
    assert recorded_error(path) == expected
