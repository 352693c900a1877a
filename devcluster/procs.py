"""Starting detached processes and making sure none is left behind.

Every process a cluster starts carries ``DEVCLUSTER_RUN_DIR=<run dir>`` in its
environment (pod processes included), so :func:`stop_all` finds them all by
scanning ``/proc`` even if a pid file is lost or a pod forked into a new session.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from devcluster.config import MARKER_ENV

logger = logging.getLogger(__name__)


def spawn(
    name: str, argv: list[str], run_dir: Path, log_dir: Path, env: dict[str, str] | None = None
) -> int:
    """Start ``argv`` detached (own session, output to ``log_dir/name.log``); return its pid."""
    log_dir.mkdir(parents=True, exist_ok=True)
    full_env = dict(os.environ if env is None else env)
    full_env[MARKER_ENV] = str(run_dir)
    with open(log_dir / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            start_new_session=True,
            close_fds=True,
        )
    logger.debug("started %s (pid %d): %s", name, proc.pid, " ".join(argv))
    # The Popen object is dropped on purpose: the process outlives this one.
    proc.returncode = 0
    return proc.pid


def alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie (our own dead children are reaped)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]
    if state in (b"Z", b"X"):
        # A multi-threaded process whose main thread exited shows as Z while its
        # other threads still run: it is gone only when it can be reaped.
        try:
            if len(os.listdir(f"/proc/{pid}/task")) > 1:
                return True
        except OSError:
            return False
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        return False
    return True


def is_marked(pid: int, run_dir: Path) -> bool:
    """True if live process ``pid`` belongs to the cluster in ``run_dir``."""
    needle = f"{MARKER_ENV}={run_dir}\0".encode()
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read() + b"\0"
    except OSError:
        return False
    return needle in environ and alive(pid)


def _this_process_and_its_ancestors() -> set[int]:
    """This process and those it runs under: a shell that exported the marker to choose the
    run directory carries it too, and is not part of the cluster."""
    found, pid = set(), os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return found


def marked_pids(run_dir: Path) -> list[int]:
    """Pids of live processes whose environment marks them as part of ``run_dir`` (never
    this process or one it runs under)."""
    mine = _this_process_and_its_ancestors()
    return [
        int(entry)
        for entry in os.listdir("/proc")
        if entry.isdigit() and int(entry) not in mine and is_marked(int(entry), run_dir)
    ]


def signal_pids(pids: Iterable[int], sig: int) -> None:
    """Send ``sig`` to each pid and to its process group when it leads one."""
    for pid in pids:
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait until every pid is gone; return those still alive at the deadline."""
    remaining = [p for p in pids if alive(p)]
    deadline = time.monotonic() + timeout
    while remaining and time.monotonic() < deadline:
        time.sleep(0.05)
        remaining = [p for p in remaining if alive(p)]
    return remaining


def terminate(pids: list[int], grace: float) -> None:
    """SIGTERM ``pids``, wait up to ``grace`` seconds, then SIGKILL the rest."""
    signal_pids(pids, signal.SIGTERM)
    left = wait_gone(pids, grace)
    if left:
        logger.info("killing %d process(es) that ignored SIGTERM: %s", len(left), left)
        signal_pids(left, signal.SIGKILL)
        wait_gone(left, 5.0)


def stop_all(run_dir: Path, ordered: list[int], grace: float = 10.0) -> None:
    """Stop ``ordered`` pids one after another, then every other marked process."""
    for pid in ordered:
        # A pid file may be stale (reboot, pid reuse): only touch our own processes.
        if is_marked(pid, run_dir):
            terminate([pid], grace)
    for _ in range(5):
        rest = marked_pids(run_dir)
        if not rest:
            return
        logger.info("stopping %d leftover process(es): %s", len(rest), rest)
        terminate(rest, 2.0)
    rest = marked_pids(run_dir)
    if rest:
        raise RuntimeError(f"processes survived SIGKILL: {rest}")
