"""Worker processes on this machine, one per (host, slot), for ``elasticjob-run``.

Several "hosts" share the machine: each host name must resolve to a local address
(``localhost``, ``127.0.0.1``, ``127.0.1.7``...), and the host's workers bind to it.
Every output line of a worker is prefixed with its current rank and its stream
(``[1]<stdout>:``, ``[1]<stderr>:``), as horovodrun does.

Workers never outlive the launcher: each is started with ``PR_SET_PDEATHSIG`` (Linux), so the
kernel kills it when the launcher dies, even by SIGKILL (a worker forked from the job's start
server, ``warm_workers.py``, when the server dies, which dies with the launcher); and
``elasticjob-run`` tells each :data:`ORPHAN_TIMEOUT_S` (``ELASTICJOB_ORPHAN_TIMEOUT``), so a
process the kernel does not cover (a worker command's own child) exits once the launcher's
rendezvous stays unreachable.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import shutil
import signal
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from elasticjob.driver.driver_types import DriverError, WorkerLauncher
from elasticjob.launcher.output_files import RankOutputFiles
from elasticjob.launcher.warm_workers import (
    StartedWorker,
    server_env,
    shared_server,
    start_warm,
    varying,
)
from elasticjob.library_env import (
    ENV_GLOO_SOCKET_IFNAME,
    ENV_NCCL_SOCKET_IFNAME,
    ENV_PYTHONUNBUFFERED,
    with_worker_defaults,
)
from elasticjob.process_death import die_with
from elasticjob.rendezvous.job_credentials import JobKey
from elasticjob.script_env import planned_env
from elasticjob.wire.messages import SlotInfo, WorkerId
from elasticjob.worker_contract import WorkerConfig, WorkerSettings, restart_agent_command
from elasticjob.worker_runtime.agents.start_server import StartServer, serves, warm_start

logger = logging.getLogger(__name__)

ORPHAN_TIMEOUT_S = 10.0
"""How long a worker of ``elasticjob-run`` keeps running while the launcher's rendezvous
is unreachable (the launcher runs it in-process: unreachable means the launcher is gone)."""

OUTPUT_DRAIN_S = 1.0
"""How long a worker's exit waits for the rest of its output before the driver hears of it:
its pipes close with it, unless a process it started (a data loader's worker) holds them."""


def check_command(command: Sequence[str], path: str | None) -> None:
    """Raise :class:`DriverError` naming the program when ``command`` cannot be run: a
    program without ``/`` that is not on ``path``, or a file that is missing or not
    executable."""
    if not command:
        raise DriverError("no worker command given")
    program = command[0]
    if os.sep not in program:
        if shutil.which(program, path=path) is None:
            raise DriverError(f"worker command {program!r} not found (not on PATH)")
    elif not os.path.isfile(program):
        raise DriverError(f"worker command {program!r} not found")
    elif not os.access(program, os.X_OK):
        raise DriverError(f"worker command {program!r} is not executable")


def restart_mode_command(command: Sequence[str]) -> list[str]:
    """The command of a restart-mode worker: this Python running the agent, which runs
    ``command``. Raises :class:`DriverError` as :func:`check_command` does for ``command``."""
    check_command(command, os.environ.get("PATH", os.defpath))
    return restart_agent_command(sys.executable, command)


def _local_addresses() -> set[str]:
    names = {socket.gethostname(), socket.getfqdn()}
    addresses: set[str] = set()
    for name in names:
        with contextlib.suppress(OSError):
            addresses.update(str(info[4][0]) for info in socket.getaddrinfo(name, None))
    return {str(a) for a in addresses}


def resolve_local_host(host: str) -> str:
    """The local address ``host`` names; raises :class:`DriverError` if it is not local."""
    try:
        address = socket.gethostbyname(host)
    except OSError as exc:
        raise DriverError(f"host {host!r} does not resolve: {exc}") from exc
    if ipaddress.ip_address(address).is_loopback or address in _local_addresses():
        return address
    raise DriverError(
        f"host {host!r} resolves to {address}, which is not an address of this machine; "
        "elasticjob-run starts workers locally (use 127.0.0.1, 127.0.1.N, localhost...)"
    )


@dataclass(frozen=True)
class WorkerEnvironment:
    """What every worker of the job is told: the worker contract's settings and its host's
    credential (from the job's key), and the launcher's own variables (unbuffered output;
    the network interface of Gloo and NCCL when ``--network-interface`` names one)."""

    settings: WorkerSettings
    key: JobKey = field(repr=False)
    network_interface: str | None = None

    def for_worker(self, worker: WorkerId, bind_address: str, planned: SlotInfo) -> dict[str, str]:
        """The variables of ``worker``'s process, which binds to ``bind_address`` and is
        planned into ``planned`` (Horovod's rank and size variables are set from the start,
        as horovodrun sets them)."""
        config = WorkerConfig.of(
            self.settings,
            token=self.key.worker_credential(worker.hostname),
            hostname=worker.hostname,
            local_rank=worker.local_rank,
            bind_address=bind_address,
        )
        env = {**config.to_env(), **planned_env(planned), ENV_PYTHONUNBUFFERED: "1"}
        if self.network_interface:
            env[ENV_GLOO_SOCKET_IFNAME] = self.network_interface
            env[ENV_NCCL_SOCKET_IFNAME] = self.network_interface
        return env


class _ExitProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """The stream protocol of :func:`asyncio.create_subprocess_exec` that also tells when the
    process itself exited: ``Process.wait()`` returns only once its pipes closed too."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=2**16, loop=loop)
        self.exited: asyncio.Future[int] = loop.create_future()
        self._process: asyncio.SubprocessTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert isinstance(transport, asyncio.SubprocessTransport)
        self._process = transport

    def process_exited(self) -> None:
        assert self._process is not None
        code = self._process.get_returncode()
        if not self.exited.done() and code is not None:
            self.exited.set_result(code)
        super().process_exited()


async def _spawn(
    command: Sequence[str], **kwargs: Any
) -> tuple[asyncio.subprocess.Process, _ExitProtocol]:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.subprocess_exec(
        lambda: _ExitProtocol(loop), *command, **kwargs
    )
    return asyncio.subprocess.Process(transport, protocol, loop), protocol


class LocalWorkerLauncher(WorkerLauncher):
    """Runs ``command`` once per worker as a local process: forked from the job's start server
    when ``warm`` and the command allows it (``warm_workers.py``), else started afresh. Its
    environment: ``base_env`` (the launcher's own by default) with the worker defaults it does
    not name (``library_env``), then ``environment``'s variables for the worker.

    Raises :class:`DriverError` at once when ``command`` cannot be run (see
    :func:`check_command`), and from :meth:`start` when starting it fails anyway."""

    def __init__(
        self,
        command: Sequence[str],
        environment: WorkerEnvironment,
        on_exit: Callable[[WorkerId, int], object],
        rank_of: Callable[[WorkerId], int | None],
        *,
        warm: bool = True,
        start_server: str | None = None,
        base_env: Mapping[str, str] | None = None,
        output: TextIO = sys.stdout,
        output_files: RankOutputFiles | None = None,
        stop_grace_s: float = 10.0,
    ) -> None:
        self._base_env = with_worker_defaults(os.environ if base_env is None else base_env)
        check_command(command, self._base_env.get("PATH", os.defpath))
        self._command = list(command)
        self._warm = warm_start(command) if warm else None
        self._start_server = start_server
        self._server: StartServer | None = None
        self._environment = environment
        self._on_exit = on_exit
        self._rank_of = rank_of
        self._output = output
        self._output_files = output_files
        self._stop_grace_s = stop_grace_s
        self._processes: dict[WorkerId, StartedWorker] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, worker: WorkerId, planned: SlotInfo) -> None:
        bind_address = resolve_local_host(worker.hostname)
        env = self._base_env | self._environment.for_worker(worker, bind_address, planned)
        process = await self._warm_start(env) or await self._cold_start(env)
        self._processes[worker] = process
        logger.debug("started worker %s (pid %d)", worker, process.pid)
        task = asyncio.create_task(self._supervise(worker, process), name=f"worker {worker}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _warm_start(self, env: dict[str, str]) -> StartedWorker | None:
        """The worker forked from the start server (started at the first warm start); None
        when it is to start cold."""
        if self._warm is None:
            return None
        if self._server is None and self._start_server is not None:
            self._server = shared_server(self._start_server, self._warm, env)
        if self._server is None:
            try:
                self._server = StartServer(self._warm, server_env(env))
            except OSError as exc:
                logger.warning("no start server (%s): every worker starts cold", exc)
                self._warm = None
                return None
        if not serves(self._server.env, env, varying(self._server, env)):
            return None
        try:
            return await start_warm(self._server, env, os.getcwd())
        except OSError as exc:
            logger.warning("a worker starts cold: %s", exc)
            return None

    async def _cold_start(self, env: dict[str, str]) -> StartedWorker:
        try:
            process, protocol = await _spawn(
                self._command,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
                preexec_fn=die_with(os.getpid()) if sys.platform == "linux" else None,
            )
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise DriverError(
                f"worker command {self._command[0]!r} cannot be run: {reason}"
            ) from exc
        assert process.stdout is not None and process.stderr is not None
        return StartedWorker(process.pid, process.stdout, process.stderr, protocol.exited)

    async def _supervise(self, worker: WorkerId, process: StartedWorker) -> None:
        """Forward the worker's output; report its exit as soon as the process is gone (after
        the rest of its output, for at most :data:`OUTPUT_DRAIN_S`), then forward what a
        process it started still writes to the pipes it inherited."""
        output = asyncio.gather(
            self._forward(worker, process.stdout, "stdout"),
            self._forward(worker, process.stderr, "stderr"),
        )
        code = await process.exited
        await asyncio.wait({output}, timeout=OUTPUT_DRAIN_S)
        self._processes.pop(worker, None)
        logger.debug("worker %s exited with %d", worker, code)
        self._on_exit(worker, code)
        await output

    async def _forward(self, worker: WorkerId, stream: asyncio.StreamReader, name: str) -> None:
        """Copy the lines of a worker's ``stdout`` or ``stderr`` to the launcher's output,
        prefixed with its current rank as horovodrun does, and to its rank's file."""
        async for raw in stream:
            rank = self._rank_of(worker)
            line = raw.decode(errors="replace")
            prefix = f"[{rank}]" if rank is not None else f"[{worker}]"
            self._output.write(f"{prefix}<{name}>:{line}")
            self._output.flush()
            if self._output_files is not None:
                self._output_files.write(worker, rank, name, line)

    async def stop(self, worker: WorkerId) -> None:
        process = self._processes.get(worker)
        if process is None or process.exited.done():
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(process.exited), self._stop_grace_s)
        except TimeoutError:
            await self.kill(worker, "it did not stop within its grace period")

    async def kill(self, worker: WorkerId, reason: str) -> None:
        """SIGKILL the worker's process group (a stopped process cannot handle SIGTERM; the
        driver logged ``reason``)."""
        process = self._processes.get(worker)
        if process is None or process.exited.done():
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await asyncio.shield(process.exited)

    async def stop_all(self) -> None:
        """Give every process the grace period to exit on its own (the job's end reaches
        workers through the rendezvous), then stop the rest, and the start server."""
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=self._stop_grace_s)
        await asyncio.gather(*(self.stop(w) for w in list(self._processes)))
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=self._stop_grace_s)
        if self._server is not None:
            self._server.close()
        if self._output_files is not None:
            self._output_files.close()
