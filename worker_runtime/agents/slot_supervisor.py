"""``python -m elasticjob.worker_runtime.agents.slot_supervisor N -- COMMAND...``: run one worker
process per slot of a pod (``ELASTICJOB_LOCAL_RANK``, ``HOROVOD_LOCAL_RANK`` and
``LOCAL_RANK`` 0..N-1), as the operator does for ``slotsPerWorker > 1``.

Signals are forwarded to every slot. The first slot that fails takes the others down and its
exit status becomes the pod's; the pod succeeds when every slot does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence

from elasticjob.worker_contract import ENV_HOSTNAME, ENV_LOCAL_RANK, SLOTS_MODULE, launch_env


def run_slots(slots: int, command: Sequence[str]) -> int:
    """Run ``command`` once per slot and return the pod's exit status."""
    hostname = os.environ.get(ENV_HOSTNAME, "localhost")
    alive = {
        subprocess.Popen(
            command,
            env={**os.environ, ENV_LOCAL_RANK: str(slot), **launch_env(hostname, slot)},
        ).pid
        for slot in range(slots)
    }

    def forward(signum: int, _frame: object) -> None:
        for pid in alive:
            os.kill(pid, signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, forward)
    while alive:
        pid, status = os.wait()
        alive.discard(pid)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            for other in alive:
                os.kill(other, signal.SIGKILL)
            return 128 - code if code < 0 else code
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--" or not args[0].isdigit() or int(args[0]) < 1:
        print(f"usage: python -m {SLOTS_MODULE} N -- COMMAND...", file=sys.stderr)
        return 2
    return run_slots(int(args[0]), args[2:])


if __name__ == "__main__":
    sys.exit(main())
