"""A shared start server (``elasticjob-run --serve-starts SOCKET``) for tests: started and
awaited until it listens, then stopped; and the environment a test's launcher gets, which
such a server serves."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

TEST_PROCESS_VARIABLES = frozenset({"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR"})
"""What the test process's environment gains as it runs, not passed on to launchers: pytest
sets the first anew for each test, torch's compiler sets the second when a test imports it
here (a shared server, started before, serves only launchers whose environment equals its
own but for the job's variables)."""
LISTENING_S = 120.0
"""How long a server may take to import torch and listen."""


def launcher_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (this process's by default) for a launcher: without what the test process
    gained as it ran (:data:`TEST_PROCESS_VARIABLES`)."""
    source = os.environ if env is None else env
    return {k: v for k, v in source.items() if k not in TEST_PROCESS_VARIABLES}


@contextlib.contextmanager
def shared_start_server(
    socket_path: Path, env: Mapping[str, str] | None = None
) -> Iterator[subprocess.Popen[str]]:
    """A shared start server listening at ``socket_path`` with ``env`` (this process's by
    default) while the block runs; stopped (SIGTERM) after it."""
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "elasticjob.launcher.run_command",
            "--serve-starts",
            str(socket_path),
        ],
        env=launcher_env(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert server.stdout is not None
        readable, _, _ = select.select([server.stdout], [], [], LISTENING_S)
        line = server.stdout.readline() if readable else ""
        if "listening on" not in line:
            raise RuntimeError(f"the start server did not listen: {line!r}")
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
