"""The restart mode's agent: runs an unchanged torchrun script, and starts it again with its
new rank at every change of the job, inside the same process slot (the same pod).

    python -m elasticjob.worker_runtime.agents.restart_agent -- python train.py --epochs 3

``elasticjob-run --mode restart`` and the operator (``spec.mode: restart``) start one agent
per slot in place of the script. To the driver the agent is the worker: it asks for rounds
(through the round protocol's joiner, ``rounds/joiner.py``), beats, and hears the job's
notices as the worker runtime does (``rounds/notice_causes.py``). Each round it gets, it
serves a fresh TCPStore (rank 0's agent: the store every rank's ``init_process_group``
joins, as torchrun's agent serves it; a fresh one per start, so a start never reads the keys
of the one before) and starts the script with torchrun's worker contract
(``script_env.restart_env``). Then, whichever comes first:

- the script ends 0: the agent reports success and exits 0 (rank 0's agent once every other
  rank's script ended too: the exit barrier of ``start_keys.py``);
- the script fails on its own (an exit code, or a signal its agent did not send): the agent
  tells the driver how with its next request for a round (``ScriptExit``), which fails the
  round for everyone and counts a restart; the driver fails the job when the script failed
  everywhere, or once the restart limit is spent;
- a notice for the round (a member failed, hosts were added or are leaving), or another
  agent's word that a restart follows (``start_keys.py``): the agent stops the script
  (SIGTERM, then SIGKILL after :data:`STOP_GRACE_S`; after a failure, only once the script
  had its grace to end on its own, or at once when a restart follows in any case) and asks
  for the next round.

``restart_decisions.py`` decides; :class:`RestartAgent` carries it out, waiting only for
events (:class:`Wakeups`) between its deadlines.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from torch.distributed import Store

from elasticjob.script_env import PER_START_ENV, restart_env
from elasticjob.wire.messages import Notice, ResultRequest, ScriptExit, WorkerState
from elasticjob.worker_contract import RESTART_AGENT_MODULE, WorkerConfig
from elasticjob.worker_runtime.agents.restart_decisions import (
    Attempt,
    AwaitEvents,
    Running,
    after_attempt,
    script_environ,
    stop_cause,
    while_running,
)
from elasticjob.worker_runtime.agents.script_process import ScriptProcess, recorded_error
from elasticjob.worker_runtime.agents.start_keys import EXIT_BARRIER_S, StartKeys
from elasticjob.worker_runtime.agents.start_server import StartServer, serves, warm_start
from elasticjob.worker_runtime.agents.undumpable import make_undumpable
from elasticjob.worker_runtime.diagnostics.log import CONTEXT, get_logger
from elasticjob.worker_runtime.exceptions import WorkerRemoved
from elasticjob.worker_runtime.link.notices import NoticeWatcher
from elasticjob.worker_runtime.link.rendezvous_client import RendezvousClient, RendezvousClientError
from elasticjob.worker_runtime.rounds.joiner import Assignment, Joiner, serve_store
from elasticjob.worker_runtime.rounds.notice_causes import NoticeCause
from elasticjob.worker_runtime.worker_process import liveness_for, wrapped_command

logger = get_logger(__name__)

LOG_FORMAT = "restart-agent %(levelname)s %(name)s: %(message)s"
"""The agent's own lines on its standard error, beside the script's (each names the job, the
round, the rank: ``log.CONTEXT``)."""
STOP_GRACE_S = 10.0
"""How long a script that is stopped may take to end after SIGTERM before SIGKILL."""


class Wakeups:
    """Wake-ups of the agent's waits, sent from any thread and from a signal handler: a
    ``SimpleQueue``'s ``put`` is reentrant, where an event's ``set`` in a handler could
    deadlock on the event's own lock, held by the very wait it interrupted."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[None] = queue.SimpleQueue()

    def set(self) -> None:
        """Wake the waiting thread (signal-safe)."""
        self._queue.put(None)

    def clear(self) -> None:
        """Forget the wake-ups sent so far (before looking at what they announced)."""
        while not self._queue.empty():
            self._queue.get_nowait()

    def wait(self, until: float | None) -> None:
        """Wait for a wake-up sent since the last :meth:`clear`, at the latest until
        ``until`` (``time.monotonic()``; None: no deadline)."""
        timeout = None if until is None else max(until - time.monotonic(), 0.0)
        with contextlib.suppress(queue.Empty):
            self._queue.get(timeout=timeout)


class RestartAgent:
    """Runs ``command`` for the worker ``config`` describes (see the module docstring)."""

    def __init__(self, config: WorkerConfig, command: Sequence[str]) -> None:
        self._config = config
        self._command = list(command)
        self._client = RendezvousClient.for_worker(config)
        self._joiner = Joiner(config, self._client)
        self._liveness = liveness_for(config, self._client, lambda: None)
        self._notices = NoticeWatcher(self._client, self._on_notice)
        self._timeout = datetime.timedelta(seconds=config.collective_timeout_s)
        self._wakeups = Wakeups()
        self._lock = threading.Lock()
        self._seen: list[Notice] = []
        self._terminated = False
        self._warm = warm_start(command) if config.warm_start else None
        self._error_file = Path(tempfile.mkdtemp(prefix="elasticjob-agent-")) / "error.json"
        """Where the script's ``@record`` writes its uncaught exception."""
        self._last_store: Store | None = None
        """The store served for the last start (rank 0's agent: the store its scripts and
        agents used), kept until the next round is assigned."""
        self._server: StartServer | None = None
        """The start server the script's starts are forked from (started at the first)."""
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
                server = serve_store(self._config.bind_address, self._timeout)
                assignment = self._join(after_round, script_exit, server.port, suspended)
                # The last start's store goes now: every agent of that start left it before
                # asking for this round (it served their keys until then).
                self._last_store = None
                if assignment is None:
                    return 0
                after_round = assignment.round
                keys = self._keys(assignment, server)
                step = after_attempt(self._attempt(assignment, keys))
                if step.exit_code is not None:
                    self._exit_barrier(assignment, keys)
                elif keys is not None and step.restart_follows:
                    keys.announce_restart()
                if keys is not None:
                    keys.close()
                if step.exit_code is not None:
                    return self._finish(step.exit_code)
                self._last_store = server
                self.restart_count += step.counts_restart
                script_exit, suspended = step.script_exit, step.suspended
            return 128 + signal.SIGTERM
        finally:
            if self._server is not None:
                self._server.close()
            shutil.rmtree(self._error_file.parent, ignore_errors=True)
            self._notices.stop()
            self._liveness.stop()

    def terminate(self) -> None:
        """Stop the script and end (SIGTERM: the pod is deleted). Signal-safe: it sets a flag
        and wakes the agent's wait (:class:`Wakeups`)."""
        self._terminated = True
        self._wakeups.set()

    def _join(
        self,
        after_round: int,
        script_exit: ScriptExit | None,
        store_port: int,
        suspended: bool,
    ) -> Assignment | None:
        """The next round (None: this worker leaves the job, or the job ended); ``suspended``:
        the script was stopped for a suspension."""
        try:
            return self._joiner.join(
                after_round,
                store_port,
                deadline=self._joiner.deadline(),
                script_exit=script_exit,
                suspended=suspended,
                stopped=lambda: self._terminated,
            )
        except WorkerRemoved as exc:
            logger.info("%s", exc.reason)
            return None

    def _keys(self, assignment: Assignment, server: Store) -> StartKeys | None:
        """This agent's side of the start's keys (None: a world of one has no peers)."""
        slot = assignment.slot
        if slot.size == 1:
            return None
        return StartKeys(server, slot.rank, slot.size, assignment.master, self._wakeups.set)

    def _attempt(self, assignment: Assignment, keys: StartKeys | None) -> Attempt:
        """Start the script for ``assignment``'s round; return how the attempt ended."""
        slot = assignment.slot
        CONTEXT.round, CONTEXT.rank = assignment.round, slot.rank
        env = restart_env(
            slot,
            job=self._config.job,
            master=assignment.master,
            restart_count=self.restart_count,
            max_restarts=self._config.max_restarts,
            error_file=str(self._error_file),
            inherited=os.environ,
        )
        logger.info(
            "round %d: starting the script as rank %d of %d (restart %d)",
            assignment.round,
            slot.rank,
            slot.size,
            self.restart_count,
        )
        with self._lock:
            self._seen = [n for n in self._seen if n.seq > assignment.notice_seq]
        self._error_file.unlink(missing_ok=True)  # a record is of this start only
        environ = script_environ(os.environ, env)
        script = self._start(environ)
        failed_since: float | None = None
        while True:
            self._wakeups.clear()
            if script.returncode is not None:
                tail = recorded_error(self._error_file) or script.log_tail()
                return Attempt(script.returncode, log_tail=tail)
            now = time.monotonic()
            cause = self._cause(assignment)
            if cause is NoticeCause.FAILURE and failed_since is None:
                failed_since = now  # its own failure may be on its way: let it come
            running = Running(
                cause,
                failed_since,
                restart_follows=keys is not None and keys.restart_follows,
                terminated=self._terminated,
            )
            action = while_running(running, now)
            if not isinstance(action, AwaitEvents):
                why = action.cause.value if action.cause else "SIGTERM"
                if running.restart_follows:
                    why = "another agent of the round says a restart follows"
                logger.info("stopping the script: %s", why)
                script.stop(STOP_GRACE_S)
                return Attempt(None, action.cause)
            self._wakeups.wait(action.until)

    def _start(self, environ: dict[str, str]) -> ScriptProcess:
        """Start the script with ``environ``: forked from the start server (started at the
        first start) when it can serve this start, else cold."""
        if self._warm is not None and self._server is None:
            try:
                self._server = StartServer(self._warm, environ)
            except OSError as exc:  # the pod's process or memory limit
                logger.warning("no start server (%s): every start is cold", exc)
                self._warm = None
        if self._server is not None and serves(self._server.env, environ, PER_START_ENV):
            try:
                script = ScriptProcess.forked(self._server, environ, self._wakeups.set)
            except OSError as exc:
                logger.warning("the script starts cold: %s", exc)
            else:
                logger.info("the script starts forked from the start server (torch imported)")
                return script
        return ScriptProcess.cold(self._command, environ, self._wakeups.set)

    def _exit_barrier(self, assignment: Assignment, keys: StartKeys | None) -> None:
        """The script succeeded: count it in at the exit barrier; rank 0's agent keeps its
        store up until every other rank's script has ended too (they may still be tearing
        their group down on it), at most :data:`EXIT_BARRIER_S`, and no longer once the
        round failed or this worker is told to stop."""
        if keys is None:
            return
        keys.script_succeeded()
        if assignment.slot.rank != 0:
            return
        deadline = time.monotonic() + EXIT_BARRIER_S
        while True:
            self._wakeups.clear()
            if keys.all_ended or keys.restart_follows or self._terminated:
                return
            if self._cause(assignment) is NoticeCause.FAILURE:
                return
            if time.monotonic() >= deadline:
                logger.warning(
                    "not every rank's script ended within %.0f s of this one", EXIT_BARRIER_S
                )
                return
            self._wakeups.wait(deadline)

    def _cause(self, assignment: Assignment) -> NoticeCause | None:
        """Why the script of ``assignment``'s round must stop, from the notices seen."""
        with self._lock:
            seen = list(self._seen)
        return stop_cause(seen, assignment.round, assignment.notice_seq)

    def _on_notice(self, notice: Notice) -> None:
        with self._lock:
            self._seen.append(notice)
        self._wakeups.set()

    def _finish(self, exit_code: int) -> int:
        """The script succeeded: say so before exiting, so that the driver awaits the exit
        rather than the next beat."""
        try:
            self._client.report_result(
                ResultRequest(
                    hostname=self._config.hostname,
                    local_rank=self._config.local_rank,
                    state=WorkerState.SUCCESS,
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
    make_undumpable()  # the script, of the same user, cannot read the token from /proc
    agent = RestartAgent(config, args)
    signal.signal(signal.SIGTERM, lambda _signum, _frame: agent.terminate())
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
