"""When the local launcher reports a worker's exit: as soon as the process is gone, even while
a process it started still holds its output pipes (a data loader's worker does until it
notices its parent died). Real processes (``sh``), no torch."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import sys

import pytest

from elasticjob.launcher.processes import LocalWorkerLauncher, WorkerEnvironment
from elasticjob.rendezvous.job_credentials import JobKey
from elasticjob.wire.messages import WorkerId
from elasticjob.worker_contract import WorkerSettings
from tests.support.rendezvous_jobs import slot_of

WORKER = WorkerId("127.0.0.1", 0)
DEADLINE_S = 20.0
"""Bound on every wait; the grandchild below holds the pipes for longer."""

# Starts a grandchild that keeps the inherited stdout and stderr open, says its pid, exits 3.
COMMAND = ["sh", "-c", "sleep 60 & echo grandchild $!; exit 3"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.skipif(sys.platform != "linux", reason="the launcher's workers are Linux processes")
async def test_exit_is_reported_while_a_grandchild_holds_the_pipes() -> None:
    exits: asyncio.Queue[tuple[WorkerId, int]] = asyncio.Queue()
    output = io.StringIO()
    launcher = LocalWorkerLauncher(
        COMMAND,
        WorkerEnvironment(
            WorkerSettings(rendezvous_url="http://127.0.0.1:1", job="job"), JobKey("the-key")
        ),
        lambda worker, code: exits.put_nowait((worker, code)),
        lambda _worker: 0,
        output=output,
        stop_grace_s=1.0,
    )
    await launcher.start(WORKER, slot_of(WORKER))
    try:
        assert await asyncio.wait_for(exits.get(), DEADLINE_S) == (WORKER, 3)
        # The worker's line came first, and its grandchild still holds the pipes.
        line = output.getvalue()
        assert line.startswith("[0]<stdout>:grandchild "), line
        grandchild = int(line.split()[-1])
        assert alive(grandchild)
    finally:
        for word in output.getvalue().split():
            if word.isdigit() and alive(int(word)):
                os.kill(int(word), signal.SIGKILL)
        await asyncio.wait_for(launcher.stop_all(), DEADLINE_S)
