"""``elastic.run``: the retry loop around a training function."""

from __future__ import annotations

import functools
import os
import time
import traceback
from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

import torch

from elasticjob.wire.messages import WorkerState
from elasticjob.worker_runtime.basics import current
from elasticjob.worker_runtime.collectives.reduce import allreduce
from elasticjob.worker_runtime.collectives.reduction_ops import Max
from elasticjob.worker_runtime.collectives.round_syncs import broadcast_object
from elasticjob.worker_runtime.diagnostics.log import get_logger, stacks_if_stuck
from elasticjob.worker_runtime.elastic.state import State
from elasticjob.worker_runtime.exceptions import HorovodInternalError, HostsUpdatedInterrupt
from elasticjob.worker_runtime.link.reports import script_failure

logger = get_logger(__name__)

IN_SYNC = "state already in sync: every rank rolled back to the same commit"

VERDICT_WAIT_S = 15.0
"""How long a failure raised inside ``torch.distributed`` (a collective the script issued
itself, FSDP2's all-gathers among them) waits for the driver to say the round broke: a peer
that died breaks the collective at once, and the driver's notice follows within moments."""

FAILURE_REPORT_S = 2.0
"""How long rank 0 waits, once the round failed around it, for the progress it has not sent
yet to reach the driver: the driver judges whether failed rounds in a row made no progress
by the newest commit it heard of."""

SUSPEND_REPORT_S = 10.0
"""How long a rank leaving a suspended job waits for its last reports (rank 0's checkpoint)
to reach the driver."""

_TORCH_DISTRIBUTED = os.path.dirname(torch.distributed.__file__) + os.sep

_P = ParamSpec("_P")
_R = TypeVar("_R")
_S = TypeVar("_S", bound=State)


def is_collective_failure(exc: Exception, broken: str | None) -> bool:
    """Whether ``exc``, raised by the training function while the round's group is ``broken``
    (why it was aborted, or None while it is healthy), is a collective failure to roll back
    from. ``torch`` wraps the failure of a collective it waited for (a DDP backward pass whose
    comm hook failed) in a ``RuntimeError`` of its own; anything else fails the worker."""
    if isinstance(exc, HorovodInternalError):
        return True
    return broken is not None and isinstance(exc, RuntimeError)


def raised_in_torch_distributed(exc: BaseException) -> bool:
    """Whether ``exc`` was raised from ``torch.distributed``'s code (a collective's wait)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return any(frame.filename.startswith(_TORCH_DISTRIBUTED) for frame in frames)


def same_on_every_rank(values: tuple[int, ...] | None) -> bool:
    """Whether every rank of the round passed the same values (None matches nothing): one
    allreduce of a few integers, which every rank must call."""
    known = values is not None
    numbers = values if values is not None else (0, 0, 0)
    found = allreduce(
        torch.tensor([*numbers, *(-n for n in numbers), int(not known)], dtype=torch.int64),
        op=Max,
    )
    width = len(numbers)
    highest, lowest = found[:width], -found[width : 2 * width]
    return known and int(found[-1]) == 0 and bool(torch.equal(highest, lowest))


def sync_wanted(required: bool, rebuilt_every_round: bool, resume_pending: bool) -> bool:
    """Whether a new round syncs the state: the driver requires it (``required``: newcomers,
    or a rollback), the state is rebuilt from its commits in every round
    (``State.rebuilt_every_round``), or its sync may load a durable checkpoint that nothing
    else would (``resume_pending``: a process that never held the job's state, standalone)."""
    return required or rebuilt_every_round or resume_pending


def save_if_suspending(state: State) -> bool:
    """After :class:`HostsUpdatedInterrupt`: when every rank agrees the job is being
    suspended (a collective), write the last commit as a durable checkpoint
    (``Checkpoints.for_suspension``) and send the reports that say so; the next round
    then never comes (the worker exits 0). Returns whether it saved the state for a
    suspension (False: hosts were updated, or the checkpoint could not be written)."""
    runtime = current()
    if not runtime.suspend_agreed():
        logger.info("hosts updated; re-forming the group with live state")
        return False
    logger.info("the job is being suspended: checkpointing the last commit")
    saved = state.checkpointing.for_suspension(runtime)
    if not runtime.reports.flush(SUSPEND_REPORT_S):
        logger.warning("the last reports did not reach the driver in %.0f s", SUSPEND_REPORT_S)
    return saved


def roll_back_or_fail(state: State, exc: Exception) -> None:
    """``exc`` was raised in the elastic loop: roll ``state`` back to its last commit when it
    is a collective failure (see :func:`is_collective_failure`), else tell the driver the
    worker failed and raise it."""
    runtime = current()
    runtime.reports.flush(FAILURE_REPORT_S)
    if isinstance(exc, HorovodInternalError):
        logger.warning("%s; rolling back to the last commit", exc)
    else:
        broken = runtime.group.errored()
        if broken is None and raised_in_torch_distributed(exc):
            broken = runtime.group.await_abort(VERDICT_WAIT_S)
        if not is_collective_failure(exc, broken):
            failure = script_failure(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
            runtime.exit_code = failure.exit_code
            runtime.reports.result(WorkerState.FAILURE, failure)
            raise exc
        logger.warning("the round's group broke (%s); rolling back to the last commit", broken)
    with stacks_if_stuck():
        state.restore()


def run(func: Callable[Concatenate[_S, _P], _R]) -> Callable[Concatenate[_S, _P], _R]:
    """Run ``func(state, ...)`` elastically.

    - A collective failure (:class:`HorovodInternalError`, or any ``RuntimeError`` raised
      once the round's group is broken: ``torch`` wraps the failure of a collective it
      waited for, such as a DDP backward pass's): roll ``state`` back to its last
      commit, join the next round saying so (the driver then fails the round, so every rank
      rolls back, and makes the next round resync from rank 0), resync, retry. When every
      rank of the new round rolled back to the same commit (equal
      :attr:`State.commit_token` and step count, which ``restore()`` brought back to the
      commit's; checked with one small allreduce), their states are already equal and the
      sync is skipped.
    - Hosts added or removed (:class:`HostsUpdatedInterrupt`, raised on all ranks at the same
      step): keep the live state, join the next round, resync only if the driver says the new
      round needs it (newcomers), retry.
    - The job is being suspended (a :class:`HostsUpdatedInterrupt` too, and every rank agrees
      it is a suspension): write the last commit as a durable checkpoint, where the job has a
      checkpoint policy, then ask for the next round, which never comes: the worker exits 0.

    A worker added to a running job joins here, on entering the loop (its ``init()`` left it in
    a provisional world of one, with its tentative place as rank and size), so the others keep
    training while it starts up.

    Whether a round syncs at all is :func:`sync_wanted`'s decision. On a round's rank 0 that
    never held the job's committed state (no member of the previous round survived, or the
    job's first start), the sync first loads the newest durable checkpoint of the job's
    checkpoint folder, if any (``State.checkpointing``; ``checkpoint.py``).

    After each reset, the state's reset callbacks run once the new group exists and before
    the sync. A worker that is no longer part of the job exits 0 from the reset. When
    ``func`` returns, the driver is told the worker succeeded; when it raises, that it
    failed and why.
    """

    def wrapper(state: _S, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        runtime = current()
        if runtime.join_deferred():
            state.on_reset()
        required = runtime.sync_required
        rolled_back = False
        while True:
            suspended = False
            try:
                token = state.commit_token if rolled_back else None
                rolled_back = False
                resume_pending = state.checkpointing.resume_pending
                if sync_wanted(required, state.rebuilt_every_round, resume_pending):
                    started = time.monotonic()
                    if same_on_every_rank(None if token is None else (*token, runtime.step)):
                        elapsed = time.monotonic() - started
                        logger.info(IN_SYNC + " (%.3f s)", elapsed)
                    else:
                        state.sync()
                        runtime.step = broadcast_object(runtime.step, root_rank=0)
                        elapsed = time.monotonic() - started
                        logger.info("state synced from rank 0 in %.3f s", elapsed)
                runtime.reports.resumed(restored_from=state.checkpointing.take_loaded())
                result = func(state, *args, **kwargs)
                state.checkpointing.wait()
            except HostsUpdatedInterrupt:
                try:
                    suspended = save_if_suspending(state)
                except Exception as exc:
                    roll_back_or_fail(state, exc)
                    rolled_back = True
            except Exception as exc:
                roll_back_or_fail(state, exc)
                rolled_back = True
            else:
                runtime.exit_code = 0
                runtime.reports.result(WorkerState.SUCCESS)
                return result
            required = runtime.reset(rolled_back=rolled_back, suspended=suspended)
            state.on_reset()

    functools.update_wrapper(wrapper, func)
    return wrapper
