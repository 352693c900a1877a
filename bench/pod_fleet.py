"""Idle workers of many worker pods played by one process (the operator benchmark's load side).

A worker pod of the benchmark runs :data:`SHIM`, a shell that writes its environment (the
worker contract's variables: rendezvous URL, job, token, hostname, heartbeat interval) and its
process id to a spool directory, then ``exec``s ``sleep``: a pod costs a sleeping process, not
a Python interpreter. This process picks up each spooled pod and plays its worker with
``sim_worker.SimWorker`` (the real protocol over HTTP: round, rendezvous, notices, heartbeats,
progress as rank 0), and kills the simulated worker when the pod's process is gone (the pod was
deleted, or its node failed), as the worker process would have died with it.

The pods' rendezvous URL names the operator's Service, which only the pods' hosts files
resolve: ``--address`` is the operator pod's address to reach it at instead.

Usage: python bench/pod_fleet.py --spool DIR --address IP
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.sim_worker import Fleet
from elasticjob.worker_contract import (
    ENV_HEARTBEAT_INTERVAL,
    ENV_HOSTNAME,
    ENV_JOB,
    ENV_RENDEZVOUS_URL,
    ENV_TOKEN,
)

SPOOL_ENV = "BENCH_POD_SPOOL"
"""The variable that names the spool directory in the pod (set by the benchmark's template)."""

SHIM = (
    f'f="${SPOOL_ENV}/${ENV_HOSTNAME}"; '
    '{ echo "PID=$$$$"; env; } > "$f.tmp" && mv "$f.tmp" "$f.env" && exec sleep 2147483647'
)
"""The worker container's shell command (``sh -c``; Kubernetes turns ``$$`` into ``$``)."""

POLL_S = 0.2

logger = logging.getLogger("pod_fleet")


def read_spooled(path: Path) -> dict[str, str]:
    """The ``NAME=value`` lines of a spooled pod (multi-line values are not needed)."""
    found = {}
    for line in path.read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep:
            found.setdefault(name, value)
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def serve(spool: Path, address: str) -> None:
    fleet: Fleet | None = None
    pids: dict[tuple[str, str, int], int] = {}
    seen: set[str] = set()
    while True:
        for path in spool.glob("*.env"):
            if path.name in seen:
                continue
            seen.add(path.name)
            env = read_spooled(path)
            if fleet is None:
                port = urlsplit(env[ENV_RENDEZVOUS_URL]).port
                interval = env.get(ENV_HEARTBEAT_INTERVAL)
                fleet = Fleet(
                    f"http://{address}:{port}",
                    lambda _key, _code: None,
                    float(interval) if interval else None,
                )
            key = (env[ENV_JOB], env[ENV_HOSTNAME], 0)
            fleet.credentials[key[:2]] = env[ENV_TOKEN]
            pids[key] = int(env["PID"])
            fleet.start(key)
        for key, pid in list(pids.items()):
            if not alive(pid):
                del pids[key]
                assert fleet is not None
                fleet.kill(key)
        await asyncio.sleep(POLL_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spool", type=Path, required=True)
    parser.add_argument("--address", required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(serve(args.spool, args.address))


if __name__ == "__main__":
    main()
