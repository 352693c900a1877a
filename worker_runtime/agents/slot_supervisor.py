"""``python -m elasticjob.worker_runtime.agents.slot_supervisor N -- COMMAND...``: run one worker
process per slot of a pod (``ELASTICJOB_LOCAL_RANK``, ``HOROVOD_LOCAL_RANK`` and
``LOCAL_RANK`` 0..N-1), as the operator does for ``slotsPerWorker > 1``.

Signals are forwarded to every slot. A failed slot is reported to the job's rendezvous
service at once (``POST exits``), so that the driver fails its round without waiting for the
pod's status, or for the slot's peers to miss it. The driver answers what the pod does
(``elasticjob.driver.slot_loss``): start a fresh process in the slot, the others going on;
or, as when nobody answers, take the others down, the failed slot's exit status becoming the
pod's. The pod succeeds when every slot does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence

from elasticjob.wire.messages import ExitReport
from elasticjob.worker_contract import (
    ENV_HOSTNAME,
    ENV_LOCAL_RANK,
    SLOTS_MODULE,
    WorkerConfig,
    launch_env,
)
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
    report = exit_reporter(envs[0])

    def start(slot: int) -> int:
        return subprocess.Popen(command, env=envs[slot]).pid

    alive = {start(slot): slot for slot in range(slots)}

    def forward(signum: int, _frame: object) -> None:
        for pid in alive:
            os.kill(pid, signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    while alive:
        pid, status = os.wait()
        slot = alive.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            if report(slot, code):
                alive[start(slot)] = slot
                continue
            for other in alive:
                os.kill(other, signal.SIGKILL)
            return 128 - code if code < 0 else code
    return 0


def exit_reporter(env: Mapping[str, str]) -> Callable[[int, int], bool]:
    """What tells the job's rendezvous service that a slot of the pod run with ``env`` ended
    with a code, and returns whether the driver has the slot restarted (made before the slots
    start, so that a report waits for nothing but its request; False without a service: a
    pod run by hand). A report that does not arrive is said on standard error, and answers
    False."""
    try:
        config = WorkerConfig.from_env(env)
    except (RuntimeError, ValueError) as unusable:
        print(f"{SLOTS_MODULE}: slot exits go unreported: {unusable}", file=sys.stderr)
        config = None
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
    return run_slots(int(args[0]), args[2:])


if __name__ == "__main__":
    sys.exit(main())
