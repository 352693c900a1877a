"""The restart mode's agent: runs an unchanged torchrun script, and starts it again with its
new rank at every change of the job, inside the same process slot (the same pod).

    python -m elasticjob.worker_runtime.agents.restart_agent -- python train.py --epochs 3

``elasticjob-run --mode restart`` and the operator (``spec.mode: restart``) start one agent
per slot in place of the script. To the driver the agent is the worker: it asks for rounds,
beats, and hears the job's notices as the worker runtime does. Each round it gets, it serves
a fresh TCPStore (rank 0's agent: the store every rank's ``init_process_group`` joins, as
torchrun's agent serves it; a fresh one per start, so a start never reads the keys of the one
before) and starts the script with torchrun's worker contract (``script_env.restart_env``).
Then, whichever comes first:

- the script ends 0: the agent reports success and exits 0;
- the script fails on its own (an exit code, or a signal its agent did not send): the agent
  tells the driver how with its next request for a round (``ScriptExit``), which fails the
  round for everyone and counts a restart; the driver fails the job when the script failed
  everywhere, or once the restart limit is spent;
- a notice for the round (a member failed, hosts were added or are leaving): the agent stops
  the script (SIGTERM, then SIGKILL after :data:`STOP_GRACE_S`; after a failure, only once
  the script had :data:`FAILURE_GRACE_S` to end on its own) and asks for the next round.

:func:`restart_cause` and :func:`after_attempt` decide; :class:`RestartAgent` carries it out.
"""

from __future__ import annotations

import contextlib
import datetime
import enum
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from torch.distributed import TCPStore

from elasticjob.script_env import restart_env, serves_start
from elasticjob.wire.messages import (
    Notice,
    NoticeKind,
    RendezvousRequest,
    RendezvousResponse,
    RendezvousStatus,
    ResultRequest,
    ScriptExit,
    WorkerState,
)
from elasticjob.worker_contract import (
    RESTART_AGENT_MODULE,
    WorkerConfig,
    is_worker_contract_env,
)
from elasticjob.worker_runtime.agents.script_process import (
    ScriptProcess,
    recorded_error,
    warm_start,
)
from elasticjob.worker_runtime.diagnostics.log import CONTEXT, get_logger
from elasticjob.worker_runtime.link.notices import NoticeWatcher
from elasticjob.worker_runtime.link.rendezvous_client import RendezvousClient, RendezvousClientError
from elasticjob.worker_runtime.worker_process import liveness_for, wrapped_command

logger = get_logger(__name__)

LOG_FORMAT = "restart-agent %(levelname)s %(name)s: %(message)s"
"""The agent's own lines on its standard error, beside the script's (each names the job, the
round, the rank: ``log.CONTEXT``)."""
STOP_GRACE_S = 10.0
"""How long a script that is stopped may take to end after SIGTERM before SIGKILL."""
FAILURE_GRACE_S = 5.0
"""How long a script may go on after a member of its round failed before it is stopped: its
collectives usually fail at once and it ends on its own, which tells the driver whether the
script failed everywhere (the job fails) or was lost somewhere (the job restarts)."""
EXIT_BARRIER_S = 60.0
"""How long rank 0's agent keeps its store up for the other ranks' scripts once its own
script succeeded."""
SPARE_AFTER_S = 3.0
"""How long after a start the agent starts the spare interpreter for the next one (it would
compete with the start for the CPU)."""
SIGNAL_CHECK_S = 1.0
"""How often a wait of the agent looks whether SIGTERM came (a signal handler only sets a
flag: setting an event there could deadlock on the event's own lock)."""
_ENDED_KEY = "elasticjob/scripts-ended"
_ALL_ENDED_KEY = "elasticjob/all-scripts-ended"


class Cause(enum.Enum):
    """Why a running script is stopped and started again."""

    FAILURE = "a member of the round failed"
    """Counts as a restart (``TORCHELASTIC_RESTART_COUNT``)."""
    HOSTS = "hosts were added or are leaving"
    """Does not count, as under torchrun."""
    SUSPEND = "the job is being suspended"
    """Does not count; the next round never comes (the script checkpoints on SIGTERM, or
    resumes from its last checkpoint of its own)."""


def restart_cause(notice: Notice, round_number: int, joined_seq: int) -> Cause | None:
    """What ``notice`` means to a script running in ``round_number``, which was published
    when the job's notices were at ``joined_seq``: a notice posted before is accounted for
    by the round, and a failure of another round is not this one's."""
    if notice.seq <= joined_seq:
        return None
    if notice.kind is NoticeKind.ROUND_FAILED:
        return Cause.FAILURE if notice.round == round_number else None
    if notice.kind is NoticeKind.SUSPEND:
        return Cause.SUSPEND
    return Cause.HOSTS


@dataclass(frozen=True)
class Attempt:
    """How one start of the script ended: its return code (None: it was stopped before it
    ended on its own), why it was stopped, and its last lines."""

    returncode: int | None
    cause: Cause | None = None
    log_tail: str = ""


@dataclass(frozen=True)
class NextStep:
    """What the agent does after an attempt: exit with ``exit_code`` (None: ask for the
    next round, telling the driver ``script_exit``), counting a restart or not."""

    exit_code: int | None
    script_exit: ScriptExit | None = None
    counts_restart: bool = False
    suspended: bool = False
    """The script was stopped for a suspension: the next request says so."""


def after_attempt(attempt: Attempt) -> NextStep:
    """The agent's next step once an attempt ended."""
    if attempt.returncode is None:
        return NextStep(
            None,
            counts_restart=attempt.cause is Cause.FAILURE,
            suspended=attempt.cause is Cause.SUSPEND,
        )
    if attempt.returncode == 0:
        return NextStep(0)
    script_exit = ScriptExit(exit_code=attempt.returncode, log_tail=attempt.log_tail)
    return NextStep(None, script_exit=script_exit, counts_restart=True)


def script_environ(environ: Mapping[str, str], round_env: Mapping[str, str]) -> dict[str, str]:
    """The script's environment: the agent's, without the worker contract's variables (the
    job's token among them: the script is no worker of the rendezvous), and the round's."""
    kept = {k: v for k, v in environ.items() if not is_worker_contract_env(k)}
    return {**kept, **round_env}


class RestartAgent:
    """Runs ``command`` for the worker ``config`` describes (see the module docstring)."""

    def __init__(self, config: WorkerConfig, command: Sequence[str]) -> None:
        self._config = config
        self._command = list(command)
        self._client = RendezvousClient.for_worker(config)
        self._liveness = liveness_for(config, self._client, lambda: None)
        self._notices = NoticeWatcher(self._client, self._on_notice)
        self._timeout = datetime.timedelta(seconds=config.collective_timeout_s)
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._seen: list[Notice] = []
        self._terminated = False
        self._warm = warm_start(command) if config.warm_start else None
        self._error_file = Path(tempfile.mkdtemp(prefix="elasticjob-agent-")) / "error.json"
        """Where the script's ``@record`` writes its uncaught exception."""
        self._spare: tuple[ScriptProcess, dict[str, str]] | None = None
        """The spare interpreter for the next start, and the environment it has."""
        self.restart_count = 0
        """Restarts after a failure this agent took part in (torchrun's per-node count)."""

    def run(self) -> int:
        """Run the script until the job ends for this worker; return the exit status."""
        CONTEXT.job = self._config.job
        self._notices.start()
        self._liveness.start()
        after_round, script_exit, suspended = 0, None, False
        try:
            while not self._terminated:
                server = TCPStore(
                    self._config.bind_address,
                    0,
                    is_master=True,
                    wait_for_workers=False,
                    timeout=self._timeout,
                )
                response = self._join(after_round, script_exit, server.port, suspended)
                if response is None:
                    return 0
                after_round = response.round
                step = after_attempt(self._attempt(response))
                if step.exit_code is not None:
                    self._exit_barrier(response, server)
                    return self._finish(step.exit_code)
                del server  # rank 0's store lives as long as the attempt
                self.restart_count += step.counts_restart
                script_exit, suspended = step.script_exit, step.suspended
            return 128 + signal.SIGTERM
        finally:
            if self._spare is not None:
                self._spare[0].discard()
            shutil.rmtree(self._error_file.parent, ignore_errors=True)
            self._notices.stop()
            self._liveness.stop()

    def terminate(self) -> None:
        """Stop the script and end (SIGTERM: the pod is deleted). Signal-safe: it only sets a
        flag, which the agent's waits look at every :data:`SIGNAL_CHECK_S`."""
        self._terminated = True

    def _join(
        self,
        after_round: int,
        script_exit: ScriptExit | None,
        store_port: int,
        suspended: bool,
    ) -> RendezvousResponse | None:
        """The next round (None: this worker leaves the job, or the job ended); ``suspended``:
        the script was stopped for a suspension."""
        config = self._config
        request = RendezvousRequest(
            hostname=config.hostname,
            local_rank=config.local_rank,
            address=config.bind_address,
            store_port=store_port,
            after_round=after_round,
            rolled_back=script_exit is not None,
            script_exit=script_exit,
            suspended=suspended,
        )
        deadline = time.monotonic() + config.round_wait_s
        response = self._client.await_round(
            request, deadline=deadline, stopped=lambda: self._terminated
        )
        if response is None:
            return None
        if response.status is not RendezvousStatus.ASSIGNED:
            logger.info("leaving the job: %s", response.message or response.status.value)
            return None
        return response

    def _attempt(self, response: RendezvousResponse) -> Attempt:
        """Start the script for the round of ``response``; return how the attempt ended."""
        assert response.slot is not None and response.store_address is not None
        assert response.store_port is not None
        slot = response.slot
        CONTEXT.round, CONTEXT.rank = response.round, slot.rank
        env = restart_env(
            slot,
            job=self._config.job,
            master=(response.store_address, response.store_port),
            restart_count=self.restart_count,
            max_restarts=self._config.max_restarts,
            error_file=str(self._error_file),
            inherited=os.environ,
        )
        logger.info(
            "round %d: starting the script as rank %d of %d (restart %d)",
            response.round,
            slot.rank,
            slot.size,
            self.restart_count,
        )
        with self._lock:
            self._seen = [n for n in self._seen if n.seq > response.notice_seq]
        self._error_file.unlink(missing_ok=True)  # a record is of this start only
        environ = script_environ(os.environ, env)
        script, started = self._start(environ), time.monotonic()
        failed_at: float | None = None
        while True:
            self._wake.clear()
            if script.returncode is not None:
                tail = recorded_error(self._error_file) or script.log_tail()
                return Attempt(script.returncode, log_tail=tail)
            if self._warm and not self._spare and time.monotonic() - started > SPARE_AFTER_S:
                self._start_spare(environ)
            cause = self._cause(response.round, response.notice_seq)
            if cause is Cause.FAILURE and failed_at is None:
                failed_at = time.monotonic()  # its own failure may be on its way: let it come
            grace = 0.0 if failed_at is None else failed_at + FAILURE_GRACE_S - time.monotonic()
            if cause in (Cause.HOSTS, Cause.SUSPEND) or grace < 0 or self._terminated:
                logger.info("stopping the script: %s", cause.value if cause else "SIGTERM")
                script.stop(STOP_GRACE_S)
                return Attempt(None, cause)
            self._wake.wait(SIGNAL_CHECK_S if failed_at is None else min(grace, SIGNAL_CHECK_S))

    def _start_spare(self, environ: dict[str, str]) -> None:
        """Start the spare interpreter for the next start; if it cannot start (the pod's
        process or memory limit), go on with cold starts."""
        assert self._warm is not None
        try:
            self._spare = ScriptProcess.spare(self._warm, environ), environ
        except OSError as exc:
            logger.warning("no spare interpreter (%s): the next starts are cold", exc)
            self._warm = None

    def _start(self, environ: dict[str, str]) -> ScriptProcess:
        """Start the script with ``environ``: in the spare interpreter when it can serve this
        start, else cold."""
        spare, self._spare = self._spare, None
        if spare is not None:
            process, spare_environ = spare
            if (
                self._warm is not None
                and serves_start(spare_environ, environ)
                and process.release(self._warm, environ, self._wake.set)
            ):
                logger.info("the script starts in the spare interpreter (torch imported)")
                return process
            process.discard()
        return ScriptProcess(self._command, environ, self._wake.set)

    def _exit_barrier(self, response: RendezvousResponse, server: TCPStore) -> None:
        """The script succeeded: keep rank 0's store up until every other rank's script has
        ended too (they may still be tearing their group down on it), as torchrun's agents
        wait at an exit barrier; at most :data:`EXIT_BARRIER_S`, and no longer once the round
        failed (a notice) or this worker is told to stop."""
        assert response.slot is not None and response.store_address is not None
        assert response.store_port is not None
        if response.slot.size == 1:
            return
        if response.slot.rank != 0:
            with contextlib.suppress(RuntimeError):  # rank 0's agent is gone: nobody waits
                store = TCPStore(
                    response.store_address,
                    response.store_port,
                    is_master=False,
                    timeout=datetime.timedelta(seconds=EXIT_BARRIER_S),
                )
                if store.add(_ENDED_KEY, 1) == response.slot.size - 1:
                    store.set(_ALL_ENDED_KEY, "1")
            return
        deadline = time.monotonic() + EXIT_BARRIER_S
        while time.monotonic() < deadline and not self._terminated:
            if self._cause(response.round, response.notice_seq) is Cause.FAILURE:
                return
            with contextlib.suppress(RuntimeError):  # timed out: look again
                server.wait([_ALL_ENDED_KEY], datetime.timedelta(seconds=1))
                return
        logger.warning("not every rank's script ended within %.0f s of this one", EXIT_BARRIER_S)

    def _cause(self, round_number: int, joined_seq: int) -> Cause | None:
        """Why the script of ``round_number`` must stop, from the notices seen (a failure
        first: it counts as a restart)."""
        with self._lock:
            causes = {restart_cause(n, round_number, joined_seq) for n in self._seen}
        return next((c for c in Cause if c in causes), None)

    def _on_notice(self, notice: Notice) -> None:
        with self._lock:
            self._seen.append(notice)
        self._wake.set()

    def _finish(self, exit_code: int) -> int:
        """The script succeeded: say so before exiting, so that the driver awaits the exit
        rather than the next beat."""
        try:
            self._client.report_result(
                ResultRequest(
                    hostname=self._config.hostname,
                    local_rank=self._config.local_rank,
                    state=WorkerState.SUCCESS,
                    exit_code=exit_code,
                ),
                retry_for_s=5.0,
            )
        except RendezvousClientError as exc:
            logger.warning("the driver did not take the result: %s; exiting all the same", exc)
        return exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """Run the agent for the command after ``--``; return its exit status."""
    args = wrapped_command(argv, RESTART_AGENT_MODULE)
    if args is None:
        return 2
    config = WorkerConfig.from_env()
    if config is None:
        print(
            "the restart agent runs under elasticjob-run --mode restart or the operator "
            "(no ELASTICJOB_RENDEZVOUS_URL)",
            file=sys.stderr,
        )
        return 2
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stderr)
    agent = RestartAgent(config, args)
    signal.signal(signal.SIGTERM, lambda _signum, _frame: agent.terminate())
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
