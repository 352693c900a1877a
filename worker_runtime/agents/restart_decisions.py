"""The restart mode's agent's decisions, as values (``restart_agent.py`` carries them out):
why the notices seen stop the script of a round (:func:`stop_cause`), what the agent does
while the script runs (:func:`while_running`), what follows an attempt
(:func:`after_attempt`), and the script's environment (:func:`script_environ`).

While the script runs the agent waits for events only: the script's end, a notice, the
other agents' word that a restart follows (``start_keys.py``), SIGTERM. Its one deadline:
after a member of the round failed, the grace in which the script may still fail on its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from elasticjob.wire.messages import Notice, ScriptExit
from elasticjob.worker_contract import is_worker_contract_env
from elasticjob.worker_runtime.rounds.notice_causes import (
    NoticeCause,
    classify_notice,
    concerns_round,
)

FAILURE_GRACE_S: Final = 5.0
"""How long a script may go on after a member of its round failed before it is stopped: its
collectives usually fail at once and it ends on its own, which tells the driver whether the
script failed everywhere (the job fails) or was lost somewhere (the job restarts). Cut short
once an agent of the round says a restart follows in any case (``start_keys.py``)."""


def stop_cause(seen: Iterable[Notice], round_number: int, joined_seq: int) -> NoticeCause | None:
    """Why the script of ``round_number`` (published when the notices were at ``joined_seq``)
    must stop, from the notices ``seen`` (``notice_causes.py``): a failure first, since it
    counts as a restart; None while none concerns the round."""
    causes = {classify_notice(n) for n in seen if concerns_round(n, round_number, joined_seq)}
    return next((c for c in NoticeCause if c in causes), None)


@dataclass(frozen=True)
class Running:
    """What the agent knows while the script of a round runs."""

    cause: NoticeCause | None
    """Why the notices seen stop the script (:func:`stop_cause`)."""
    failed_since: float | None
    """When the agent first saw that a member of the round failed (None: it has not)."""
    restart_follows: bool = False
    """Another agent of the round said that a restart follows whatever this script does."""
    terminated: bool = False
    """The agent got SIGTERM."""


@dataclass(frozen=True)
class StopScript:
    """Stop the script now; ``cause``: why (None: the agent was told to end)."""

    cause: NoticeCause | None


@dataclass(frozen=True)
class AwaitEvents:
    """Wait for the next event, at the latest until ``until`` (``time.monotonic()``; None:
    no deadline)."""

    until: float | None


def while_running(state: Running, now: float) -> StopScript | AwaitEvents:
    """What the agent does at ``now`` while its script runs."""
    if state.restart_follows:
        return StopScript(NoticeCause.FAILURE)
    grace_ends = None if state.failed_since is None else state.failed_since + FAILURE_GRACE_S
    if state.terminated or state.cause in (NoticeCause.HOSTS, NoticeCause.SUSPEND):
        return StopScript(state.cause)
    if grace_ends is not None and now >= grace_ends:
        return StopScript(state.cause)
    return AwaitEvents(grace_ends)


@dataclass(frozen=True)
class Attempt:
    """How one start of the script ended: its return code (None: it was stopped before it
    ended on its own), why it was stopped, and its last lines."""

    returncode: int | None
    cause: NoticeCause | None = None
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

    @property
    def restart_follows(self) -> bool:
        """A restart follows whatever the other scripts of the round do: this one was
        stopped after a member failed, or killed by a signal its agent did not send (not a
        failure of its own, so the script did not fail everywhere). The agent tells the
        other agents (``start_keys.py``), which stop their scripts at once."""
        lost = self.script_exit is None or self.script_exit.exit_code < 0
        return self.counts_restart and lost


def after_attempt(attempt: Attempt) -> NextStep:
    """The agent's next step once an attempt ended."""
    if attempt.returncode is None:
        return NextStep(
            None,
            counts_restart=attempt.cause is NoticeCause.FAILURE,
            suspended=attempt.cause is NoticeCause.SUSPEND,
        )
    if attempt.returncode == 0:
        return NextStep(0)
    script_exit = ScriptExit(exit_code=attempt.returncode, log_tail=attempt.log_tail)
    return NextStep(None, script_exit=script_exit, counts_restart=True)


def script_environ(environ: Mapping[str, str], round_env: Mapping[str, str]) -> dict[str, str]:
    """The script's environment: the agent's, without the worker contract's variables (the
    pod's credential among them: the script is no worker of the rendezvous), and the round's."""
    kept = {k: v for k, v in environ.items() if not is_worker_contract_env(k)}
    return {**kept, **round_env}
