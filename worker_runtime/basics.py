"""Process-wide entry points: ``init``, ``shutdown`` and the rank/size queries."""

from __future__ import annotations

import atexit
import logging
import os
import sys

import torch

from elasticjob.worker_contract import WorkerConfig
from elasticjob.worker_runtime.runtime import Runtime

_runtime: Runtime | None = None
_shut_down: Runtime | None = None
"""The runtime ``shutdown()`` left: still a worker of the job, without a group."""


def init() -> None:
    """Start the worker runtime and join the job's first round.

    Under ``elasticjob-run`` or the operator, the worker's identity comes from the
    environment; without it the process runs standalone as a world of one. A worker added to
    a running job returns at once with its tentative place (it joins in ``elastic.run``, see
    ``docs/worker-runtime.md``). When it returns, horovodrun's and torchrun's variables are in
    ``os.environ``. Calling ``init`` again is a no-op; after ``shutdown()`` a worker of a job
    forms the round's group again, with the same ranks (every rank must call it, as with
    Horovod), and a standalone process starts afresh."""
    global _runtime, _shut_down
    if _runtime is not None:
        return
    config = WorkerConfig.from_env()
    if _shut_down is not None:
        runtime, _shut_down = _shut_down, None
        if config is not None and config == runtime.config:  # the same worker of the job
            _runtime = runtime
            runtime.resume()
            return
        runtime.shutdown()  # standalone, or another worker now: start afresh
    runtime = Runtime(config)
    _runtime = runtime
    atexit.register(_leave, runtime)
    runtime.start()


def _leave(runtime: Runtime) -> None:
    """At interpreter exit: shut down, and skip native teardown if it could crash.

    A collective abandoned when its group was aborted keeps a backend thread and the old
    group's sockets until that group's timeout, and a lingering thread (a negotiation's in a
    store call, a broken group's teardown) may still be in native code; tearing them down in
    native destructors at interpreter exit can abort the process. When the exit status is
    known (the elastic loop ended, or the worker was removed), leave with it right away
    instead. Otherwise the
    driver is told the process is ending (see :meth:`Runtime.report_leaving`)."""
    global _runtime, _shut_down
    runtime.report_leaving()
    runtime.shutdown()
    _runtime = _shut_down = None
    stuck = runtime.group.abandoned or not runtime.settled
    if stuck and runtime.exit_code is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(runtime.exit_code)


def shutdown() -> None:
    """Destroy the process group, as Horovod's ``shutdown()`` does: the queries and
    collectives raise until ``init()`` is called again. The process stays a worker of the
    job (it leaves when it exits)."""
    global _runtime, _shut_down
    if _runtime is not None:
        _runtime.suspend()
        _runtime, _shut_down = None, _runtime


def current() -> Runtime:
    """The process's runtime; raises if ``init()`` was not called."""
    if _runtime is None:
        raise ValueError("elasticjob.worker_runtime.init() has not been called")
    return _runtime


def is_initialized() -> bool:
    return _runtime is not None


def current_round() -> int:
    """The number of the round this process is in (rounds count from 1). A worker added to a
    running job is tentatively in the next round until ``elastic.run`` joins it."""
    return current().visible[0]


def report_progress(epoch: int, step: int, samples_per_second: float = 0.0) -> None:
    """Report training progress to the driver (shown in the job's status). Only rank 0's
    report is sent; on other ranks this does nothing."""
    current().reports.progress(epoch, step, samples_per_second)


def rank() -> int:
    """This process's rank in the current round."""
    return current().visible[1].rank


def size() -> int:
    """Number of processes in the current round."""
    return current().visible[1].size


def local_rank() -> int:
    """This process's slot on its host."""
    return current().visible[1].local_rank


def local_size() -> int:
    """Number of processes of the current round on this host."""
    return current().visible[1].local_size


def cross_rank() -> int:
    """Index of this host among the hosts that run a process with this local rank."""
    return current().visible[1].cross_rank


def cross_size() -> int:
    """Number of hosts that run a process with this local rank."""
    return current().visible[1].cross_size


def device() -> torch.device:
    """The device collectives run on: ``cuda:local_rank`` under NCCL, else the CPU."""
    return current().device
