"""``python -m elasticjob.worker_runtime.agents.slot_supervisor N -- COMMAND...``: run one worker
process per slot of a pod (``ELASTICJOB_LOCAL_RANK``, ``HOROVOD_LOCAL_RANK`` and
``LOCAL_RANK`` 0..N-1), as the operator does for ``slotsPerWorker > 1``.

Signals are forwarded to every slot. A failed slot is reported to the job's rendezvous
service at once (``POST exits``), so that the driver fails its round without waiting for the
pod's status, or for the slot's peers to miss it. The driver answers what the pod does
(``elasticjob.driver.slot_loss``): start a fresh process in the slot, the others going on
(forked from the pod's start server where the command allows it: ``slot_processes.py``); or,
as when nobody answers, take the others down, the failed slot's exit status becoming the
pod's. The pod succeeds when every slot does.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence

from elasticjob.wire.messages import ExitReport
from elasticjob.worker_contract import (
    ENV_HOSTNAME,
    ENV_LOCAL_RANK,
    RESTART_AGENT_MODULE,
    SLOTS_MODULE,
    WorkerConfig,
    launch_env,
)
from elasticjob.worker_runtime.agents.slot_processes import SlotProcesses
from elasticjob.worker_runtime.agents.start_server import WarmStart, warm_start
from elasticjob.worker_runtime.link.rendezvous_client import (
    RendezvousClient,
    RendezvousClientError,
)

REPORT_FOR_S = 2.0
"""How long a failed slot's report is retried: the pod's status tells the driver later."""


def run_slots(slots: int, command: Sequence[str]) -> int:
    """Run ``command`` once per slot and return the pod's exit status."""
    hostname = os.environ.get(ENV_HOSTNAME, "localhost")
    envs = [
        {**os.environ, ENV_LOCAL_RANK: str(slot), **launch_env(hostname, slot)}
        for slot in range(slots)
    ]
    config = _config(envs[0])
    report = exit_reporter(config)
    warm = warm_restarts(command, config)
    after_s = config.start_server_after_s if config is not None else 0.0
    processes = SlotProcesses(command, envs, warm, after_s)
    for slot in range(slots):
        processes.start(slot)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda received, _frame: processes.send(received))
    while processes:
        slot, code = processes.next_end()
        if code != 0:
            if report(slot, code):
                processes.start(slot, restart=True)
                continue
            processes.kill()
            return 128 - code if code < 0 else code
    return 0


def warm_restarts(command: Sequence[str], config: WorkerConfig | None) -> WarmStart | None:
    """How a start server would run ``command`` for the pod's restarted slots (None: they
    start cold): not without a rendezvous service (nothing restarts them), with
    ``warmStart: false``, or for a restart-mode agent (it keeps its own start server, and its
    slot is never restarted in place)."""
    warm = warm_start(command) if config is not None and config.warm_start else None
    return None if warm is None or warm.module == RESTART_AGENT_MODULE else warm


def _config(env: Mapping[str, str]) -> WorkerConfig | None:
    """The pod's worker contract (None without a rendezvous service: a pod run by hand)."""
    try:
        return WorkerConfig.from_env(env)
    except (RuntimeError, ValueError) as unusable:
        print(f"{SLOTS_MODULE}: slot exits go unreported: {unusable}", file=sys.stderr)
        return None


def exit_reporter(config: WorkerConfig | None) -> Callable[[int, int], bool]:
    """What tells the job's rendezvous service that a slot of the pod of ``config`` ended
    with a code, and returns whether the driver has the slot restarted (made before the slots
    start, so that a report waits for nothing but its request; False without a service: a
    pod run by hand). A report that does not arrive is said on standard error, and answers
    False."""
    if config is None:
        return lambda _slot, _code: False
    client = RendezvousClient.for_worker(config)

    def report(slot: int, code: int) -> bool:
        exit_report = ExitReport(hostname=config.hostname, local_rank=slot, exit_code=code)
        try:
            answer = client.report_exit(exit_report, retry_for_s=REPORT_FOR_S)
        except (RendezvousClientError, OSError) as failed:
            print(f"{SLOTS_MODULE}: could not report slot {slot}'s exit: {failed}", file=sys.stderr)
            return False
        if answer.restart:
            restart = f"slot {slot} ended with {code} and starts again: {answer.reason}"
            print(f"{SLOTS_MODULE}: {restart}", file=sys.stderr)
        return answer.restart

    return report


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--" or not args[0].isdigit() or int(args[0]) < 1:
        print(f"usage: python -m {SLOTS_MODULE} N -- COMMAND...", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format=f"{SLOTS_MODULE}: %(message)s")
    return run_slots(int(args[0]), args[2:])


if __name__ == "__main__":
    sys.exit(main())
