"""Fair share of the rendezvous service: one job floods the service at its rate budget while
another job loses a worker, and the victim's recovery is measured (prints its figures;
asserts nothing).

One service process (``sim_service.py``: the real service, one real driver per job) serves a
victim job of simulated workers (``sim_worker.py``) and a flood job with no worker whose
reader token a flood process (:func:`flood`, a process of its own) uses to send ``GET round`` on
many kept-alive connections, at most at the job's sustained rate. A worker of the victim is
killed; its recovery is the time from the kill until every survivor has its slot in the next
round. Three cases, each in fresh processes, in one run:

- ``alone``:  no flood;
- ``before``: the flood job's budget as it was before the service capped it, growing with
  its maximum worker count (30 requests/s per worker: 30,720 at 1,024), set by that formula
  in the service process (``SIM_UNCAPPED_RATE``);
- ``after``:  today's budget (at most half of what the service answers, ``limits.py``).

Usage: python bench/fair_share.py [--repeats 5] [--hosts 4] [--slots 2] [--flood-workers 1024]
Run it on an otherwise idle machine: the flood, the service and the victim's workers share it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.sim_cluster import ServiceProcess, hosts_of, next_round  # noqa: E402
from bench.sim_service import UNCAPPED_ENV, uncapped  # noqa: E402
from bench.sim_worker import HttpClient  # noqa: E402
from elasticjob.rendezvous.limits import JobLimits  # noqa: E402
from elasticjob.wire.protocol import API_PREFIX, PROTOCOL_HEADER, PROTOCOL_VERSION  # noqa: E402

CONNECTIONS = 64
"""The flood's connections, each one request at a time."""
SETTLE_S = 2.0
"""How long the flood runs before the kill."""
RECOVERY_TIMEOUT_S = 120.0
CASES = ("alone", "before", "after")


def flood(url: str, job: str, token: str, rate: float) -> None:
    """Send ``GET round`` for ``job`` on :data:`CONNECTIONS` connections, at most ``rate`` a
    second in all, until interrupted (SIGINT); then print the answers counted by status and
    the rate reached, as JSON."""
    counts: dict[str, float] = {}
    start = time.monotonic()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_flood(url, job, token, rate, counts))
    counts["per_s"] = sum(counts.values()) / (time.monotonic() - start)
    print(json.dumps(counts), flush=True)


async def _flood(url: str, job: str, token: str, rate: float, counts: dict[str, float]) -> None:
    http = HttpClient(url)
    headers = f"Authorization: Bearer {token}\r\n{PROTOCOL_HEADER}: {PROTOCOL_VERSION}\r\n"
    path = f"{API_PREFIX}/jobs/{job}/round"
    start = time.monotonic()
    interval = CONNECTIONS / rate  # each connection's share of the rate

    async def one_connection(index: int) -> None:
        connection = http.connection()
        due = start + index * interval / CONNECTIONS
        while True:
            now = time.monotonic()
            if due > now:
                await asyncio.sleep(due - now)
            due += interval
            try:
                status, _, _ = await connection.request("GET", path, headers, b"", 10.0)
            except (OSError, TimeoutError, asyncio.IncompleteReadError):
                status = 0
            counts[str(status)] = counts.get(str(status), 0) + 1

    await asyncio.gather(*(one_connection(i) for i in range(CONNECTIONS)))


class FloodProcess:
    """:func:`flood` in a process of its own (its CPU is not the victim workers'), until
    :meth:`stop`."""

    def __init__(self, url: str, token: str, rate: float) -> None:
        self._process = subprocess.Popen(
            [sys.executable, __file__, "--flood", url, token, str(rate)],
            stdout=subprocess.PIPE,
            text=True,
        )

    def stop(self) -> dict[str, float]:
        """Stop it; what it counted."""
        self._process.send_signal(signal.SIGINT)
        out, _ = self._process.communicate(timeout=30)
        return dict(json.loads(out.strip().splitlines()[-1]))


async def recovery(case: str, hosts: int, slots: int, flood_workers: int,
                   log_dir: Path) -> tuple[float, dict[str, float]]:  # fmt: skip
    """One kill of a victim worker under ``case``: its recovery (s) and the flood's counts."""
    if case == "before":
        os.environ[UNCAPPED_ENV] = "1"
    else:
        os.environ.pop(UNCAPPED_ENV, None)
    async with ServiceProcess(5.0, log_dir / f"service-{case}.log") as svc:
        fleet = svc.fleet
        assert fleet is not None
        svc.add_job("victim", hosts_of("v", 0, hosts, slots), max_np=hosts * slots)
        await svc.until(
            lambda: sum(w.round >= 1 for w in fleet.running("victim")) == hosts * slots,
            "the victim's first round",
            RECOVERY_TIMEOUT_S,
        )
        flooding = None
        if case != "alone":
            svc.add_job("flood", {}, max_np=flood_workers)
            rate = (uncapped(flood_workers) if case == "before" else JobLimits.for_workers(
                flood_workers)).requests_per_s  # fmt: skip
            flooding = FloodProcess(svc.url, fleet.keys["flood"].reader_token(), rate)
        await asyncio.sleep(SETTLE_S)
        victim = ("victim", "v00001", 0)
        survivors = [w for w in fleet.running("victim") if w.host != victim[1]]
        before = max(w.round for w in survivors)
        killed_at = time.monotonic()
        fleet.kill(victim)
        await svc.until(
            lambda: all(next_round(w, before) is not None for w in survivors),
            "every survivor in the next round",
            RECOVERY_TIMEOUT_S,
        )
        last = max(t for w in survivors if (t := next_round(w, before)) is not None)
        counts = flooding.stop() if flooding is not None else {}
        return last - killed_at, counts


async def main(args: argparse.Namespace) -> None:
    print(
        f"victim: {args.hosts} hosts x {args.slots} slots; flood job: max {args.flood_workers} "
        f"workers, {CONNECTIONS} connections; load average {os.getloadavg()[0]:.2f}"
    )
    results: dict[str, list[float]] = {case: [] for case in CASES}
    with tempfile.TemporaryDirectory() as logs:
        for repeat in range(args.repeats):
            for case in CASES:
                seconds, counts = await recovery(
                    case, args.hosts, args.slots, args.flood_workers, Path(logs)
                )
                results[case].append(seconds)
                print(f"  {repeat + 1}/{args.repeats} {case:<7} recovery {seconds:.3f} s  {counts}",
                      flush=True)  # fmt: skip
    alone = statistics.median(results["alone"])
    print(f"\n{'case':<8} {'median s':>9} {'max s':>7} {'x alone':>8}")
    for case in CASES:
        median = statistics.median(results[case])
        print(f"{case:<8} {median:9.3f} {max(results[case]):7.3f} {median / alone:8.2f}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--flood":
        flood(sys.argv[2], "flood", sys.argv[3], float(sys.argv[4]))
    else:
        parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        parser.add_argument("--repeats", type=int, default=5)
        parser.add_argument("--hosts", type=int, default=4)
        parser.add_argument("--slots", type=int, default=2)
        parser.add_argument("--flood-workers", type=int, default=1024)
        asyncio.run(main(parser.parse_args()))
