"""Starting one container as a local process in its own mount and UTS namespace.

The process is started as ``unshare --mount --uts -- /bin/sh -c SETUP sh ARGV``:
the shell sets the pod's hostname, bind-mounts the pod's hosts file over
``/etc/hosts`` and each volume at its mountPath (all private to the pod), changes
to the working directory and ``exec``s the container's command, so the pid the
agent holds is the container's own process. It leads its own process group;
signals go to the whole group.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

MOUNT = "/usr/bin/mount" if os.path.exists("/usr/bin/mount") else "mount"


@dataclass
class Launch:
    """Everything needed to start one container process."""

    argv: list[str]
    env: dict[str, str]
    workdir: str
    log_path: Path
    hostname: str
    hosts_file: Path | None
    #: (host source, mountPath, read-only)
    mounts: list[tuple[str, str, bool]] = field(default_factory=list)


def namespaces_supported() -> list[str] | None:
    """The unshare prefix that works on this machine, or None without namespaces."""
    candidates = [["unshare", "--mount", "--uts"]]
    if os.geteuid() != 0:
        candidates.insert(0, ["unshare", "--user", "--map-root-user", "--mount", "--uts"])
    for prefix in candidates:
        try:
            ok = subprocess.run(
                [*prefix, "--", "true"], capture_output=True, timeout=10, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if ok.returncode == 0:
            return prefix
    logger.warning("mount namespaces are unavailable: volumes are not mounted at their mountPaths")
    return None


class StartError(Exception):
    """The command could not be started (reported as exit code 128, StartError)."""


def _setup_script(launch: Launch) -> str:
    lines = ["set -e", f"echo {shlex.quote(launch.hostname[:63])} > /proc/sys/kernel/hostname"]
    if launch.hosts_file is not None:
        lines.append(f"{MOUNT} --bind {shlex.quote(str(launch.hosts_file))} /etc/hosts")
    for src, dst, read_only in launch.mounts:
        lines.append(f"{MOUNT} --bind {shlex.quote(src)} {shlex.quote(dst)}")
        if read_only:
            lines.append(f"{MOUNT} -o remount,bind,ro {shlex.quote(dst)}")
    lines.append(f"cd {shlex.quote(launch.workdir)}")
    lines.append('exec "$@"')
    return "\n".join(lines)


def start(launch: Launch, ns_prefix: list[str] | None) -> subprocess.Popen[bytes]:
    """Start the container process; raises StartError if the command is not found."""
    exe = launch.argv[0]
    if "/" not in exe and shutil.which(exe, path=launch.env.get("PATH", "")) is None:
        raise StartError(f'exec: "{exe}": executable file not found in $PATH')
    Path(launch.workdir).mkdir(parents=True, exist_ok=True)
    launch.log_path.parent.mkdir(parents=True, exist_ok=True)
    if ns_prefix is None:
        argv = launch.argv
    else:
        argv = [*ns_prefix, "--", "/bin/sh", "-c", _setup_script(launch), "sh", *launch.argv]
    with open(launch.log_path, "ab") as log:
        try:
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=launch.env,
                cwd=launch.workdir if ns_prefix is None else "/",
                start_new_session=True,
                close_fds=True,
            )
        except OSError as err:
            raise StartError(str(err)) from err


async def wait_exit(proc: subprocess.Popen[bytes]) -> int:
    """Wait (without a thread) until ``proc`` exits; return its exit code, kubelet-style.

    A process killed by signal N reports 128+N, like a container runtime.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def exited() -> None:
        if not done.done():
            done.set_result(None)

    try:
        fd = os.pidfd_open(proc.pid)
    except (OSError, AttributeError):
        fd = -1
    if fd >= 0:
        loop.add_reader(fd, exited)
        try:
            await done
        finally:
            loop.remove_reader(fd)
            os.close(fd)
        code = proc.wait()
    else:
        while proc.poll() is None:
            await asyncio.sleep(0.1)
        code = proc.returncode
    return 128 - code if code < 0 else code


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> bool:
    """Send ``sig`` to the container's process group; False if it is gone."""
    try:
        os.killpg(proc.pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL whatever is left of the process group."""
    signal_group(proc, signal.SIGKILL)
