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
from elasticjob.worker_runtime.agents.restart_decisions import (
    FAILURE_GRACE_S,
    Attempt,
    AwaitEvents,
    NextStep,
    Running,
    StopScript,
    after_attempt,
    script_environ,
    stop_cause,
    while_running,
)
from elasticjob.worker_runtime.agents.script_process import (
    TAIL_CHARS,
    TAIL_LINES,
    ScriptProcess,
    recorded_error,
)
from elasticjob.worker_runtime.rounds.notice_causes import NoticeCause

ENDED_WITHIN_S = 30.0


def notice(seq: int, kind: NoticeKind, round_number: int) -> Notice:
    return Notice(seq=seq, kind=kind, round=round_number, hosts=("h",))


@pytest.mark.parametrize(
    ("seen", "expected"),
    [
        pytest.param(notice(5, NoticeKind.ROUND_FAILED, 3), NoticeCause.FAILURE, id="round-failed"),
        pytest.param(notice(5, NoticeKind.HOSTS_ADDED, 3), NoticeCause.HOSTS, id="hosts-added"),
        pytest.param(notice(5, NoticeKind.HOSTS_REMOVED, 3), NoticeCause.HOSTS, id="hosts-leaving"),
        pytest.param(notice(5, NoticeKind.SUSPEND, 3), NoticeCause.SUSPEND, id="suspend"),
        pytest.param(notice(4, NoticeKind.SUSPEND, 2), None, id="suspend-accounted-for"),
        pytest.param(notice(4, NoticeKind.HOSTS_ADDED, 2), None, id="posted-before-the-round"),
        pytest.param(notice(5, NoticeKind.ROUND_FAILED, 2), None, id="another-rounds-failure"),
        pytest.param(notice(3, NoticeKind.ROUND_FAILED, 3), None, id="accounted-for"),
    ],
)
def test_restart_cause(seen: Notice, expected: NoticeCause | None) -> None:
    """The script of round 3, published when the notices were at 4."""
    assert stop_cause([seen], 3, 4) is expected


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
            Attempt(None, NoticeCause.FAILURE),
            NextStep(None, counts_restart=True),
            id="stopped-for-a-failure-counts",
        ),
        pytest.param(Attempt(None, NoticeCause.HOSTS), NextStep(None), id="stopped-for-hosts"),
        pytest.param(
            Attempt(None, NoticeCause.SUSPEND),
            NextStep(None, suspended=True),
            id="stopped-for-suspend",
        ),
        pytest.param(Attempt(None), NextStep(None), id="stopped-by-sigterm"),
    ],
)
def test_after_attempt(attempt: Attempt, expected: NextStep) -> None:
    assert after_attempt(attempt) == expected


def test_a_failure_is_the_cause_among_several_notices() -> None:
    """It counts as a restart, whatever else was posted."""
    seen = [notice(5, NoticeKind.HOSTS_ADDED, 3), notice(6, NoticeKind.ROUND_FAILED, 3)]
    assert stop_cause(seen, 3, 4) is NoticeCause.FAILURE


FAILED, HOSTS, SUSPEND = NoticeCause.FAILURE, NoticeCause.HOSTS, NoticeCause.SUSPEND
NOW = 100.0


@pytest.mark.parametrize(
    ("running", "expected"),
    [
        pytest.param(Running(None, None), AwaitEvents(None), id="nothing-happened-no-deadline"),
        pytest.param(Running(HOSTS, None), StopScript(HOSTS), id="hosts-stop-at-once"),
        pytest.param(Running(SUSPEND, None), StopScript(SUSPEND), id="suspend-stops-at-once"),
        pytest.param(Running(None, None, terminated=True), StopScript(None), id="sigterm"),
        pytest.param(
            Running(FAILED, NOW - 1.0),
            AwaitEvents(NOW - 1.0 + FAILURE_GRACE_S),
            id="failure-within-the-grace-waits-for-the-script-or-the-grace",
        ),
        pytest.param(
            Running(FAILED, NOW - FAILURE_GRACE_S), StopScript(FAILED), id="failure-grace-over"
        ),
        pytest.param(
            Running(FAILED, NOW - 1.0, restart_follows=True),
            StopScript(FAILED),
            id="a-restart-follows-ends-the-grace",
        ),
        pytest.param(
            Running(None, None, restart_follows=True),
            StopScript(FAILED),
            id="a-restart-follows-before-the-notice",
        ),
        pytest.param(
            Running(FAILED, NOW - 1.0, terminated=True), StopScript(FAILED), id="sigterm-in-grace"
        ),
    ],
)
def test_while_running(running: Running, expected: StopScript | AwaitEvents) -> None:
    assert while_running(running, NOW) == expected


@pytest.mark.parametrize(
    ("attempt", "follows"),
    [
        pytest.param(Attempt(None, NoticeCause.FAILURE), True, id="stopped-after-a-failure"),
        pytest.param(Attempt(-9), True, id="killed-by-someone-else"),
        pytest.param(Attempt(3), False, id="failed-on-its-own-may-be-everywhere"),
        pytest.param(Attempt(0), False, id="succeeded"),
        pytest.param(Attempt(None, NoticeCause.HOSTS), False, id="stopped-for-hosts"),
        pytest.param(Attempt(None, NoticeCause.SUSPEND), False, id="stopped-for-suspend"),
        pytest.param(Attempt(None), False, id="stopped-by-sigterm"),
    ],
)
def test_a_restart_follows_unless_the_script_may_have_failed_everywhere(
    attempt: Attempt, follows: bool
) -> None:
    assert after_attempt(attempt).restart_follows is follows


def test_the_script_gets_no_worker_contract_variable() -> None:
    """Its token least of all: the script is no worker of the rendezvous."""
    env = script_environ(
        {ENV_TOKEN: "secret", ENV_RENDEZVOUS_URL: "http://x", "PATH": "/bin", "RANK": "9"},
        {"RANK": "1"},
    )
    assert env == {"PATH": "/bin", "RANK": "1"}


def run_script(code: str) -> tuple[ScriptProcess, threading.Event]:
    ended = threading.Event()
    script = ScriptProcess.cold([sys.executable, "-c", code], dict(os.environ), ended.set)
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
