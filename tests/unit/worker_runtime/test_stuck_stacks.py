"""A worker stuck where it should take moments writes every thread's stack (log.py)."""

from __future__ import annotations

import threading
import time

import pytest

from elasticjob.worker_runtime.diagnostics.log import stacks_if_stuck


def _parked_thread() -> tuple[threading.Thread, threading.Event]:
    release = threading.Event()
    thread = threading.Thread(target=release.wait, name="parked", daemon=True)
    thread.start()
    return thread, release


def test_a_block_that_outlasts_the_watch_writes_every_threads_stack(
    capfd: pytest.CaptureFixture[str],
) -> None:
    thread, release = _parked_thread()
    try:
        with stacks_if_stuck(after_s=0.2):
            time.sleep(1.0)
    finally:
        release.set()
        thread.join(5)
    err = capfd.readouterr().err
    assert "Timeout (0:00:00.200000)!" in err, err
    assert "test_a_block_that_outlasts_the_watch" in err, err  # the stuck thread's frame
    assert "in wait" in err, err  # the parked thread's too


def test_a_block_that_ends_in_time_writes_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    with stacks_if_stuck(after_s=0.5):
        pass
    time.sleep(0.8)  # past the watch's deadline: a watch left running would write now
    assert "Timeout" not in capfd.readouterr().err
