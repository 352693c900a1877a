"""The parent side of a simulated cluster: the service process (``sim_service.py``: the real
rendezvous service and one real driver per job) and the simulated workers it asks for
(``sim_worker.py``), with waits on what they did. Used by ``scale.py`` and the scale tests.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.sim_worker import Fleet, Key, SimWorker
from elasticjob.driver.liveness import heartbeat_interval_s
from elasticjob.rendezvous.job_credentials import JobKey

REPO = Path(__file__).resolve().parents[1]


class ServiceProcess:
    """The child process serving the jobs (``sim_service.py``), and the fleet it drives."""

    def __init__(self, heartbeat_timeout_s: float | None, log_path: Path) -> None:
        self._heartbeat_timeout_s = heartbeat_timeout_s
        self._log_path = log_path
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._stats: asyncio.Future[dict[str, Any]] | None = None
        self.url = ""
        self.fleet: Fleet | None = None
        self.discovered: dict[str, float] = {}
        self.published: dict[tuple[str, int], float] = {}
        self.ended: dict[str, dict[str, Any]] = {}
        self.changed = asyncio.Event()

    async def __aenter__(self) -> ServiceProcess:
        log = self._log_path.open("w")
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.sim_service", cwd=REPO, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, stderr=log, limit=1 << 24,
        )  # fmt: skip
        log.close()
        assert self._proc.stdout is not None
        ready = json.loads(await asyncio.wait_for(self._proc.stdout.readline(), 30))
        self.url = ready["url"]
        self.fleet = Fleet(
            self.url, self._report_exit, heartbeat_interval_s(self._heartbeat_timeout_s)
        )
        await self.fleet.__aenter__()
        self._reader = asyncio.create_task(self._read_events())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.fleet is not None:
            await self.fleet.__aexit__()
        if self._proc is not None and self._proc.returncode is None:
            self.send({"op": "quit"})
            try:
                await asyncio.wait_for(self._proc.wait(), 10)
            except TimeoutError:
                self._proc.kill()
                await self._proc.wait()
        if self._reader is not None:
            self._reader.cancel()

    def send(self, command: dict[str, Any]) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write((json.dumps(command) + "\n").encode())

    def _report_exit(self, key: Key, code: int) -> None:
        if self._proc is not None and self._proc.returncode is None:
            self.send({"op": "exit", "job": key[0], "host": key[1], "local_rank": key[2],
                       "code": code})  # fmt: skip

    async def _read_events(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None and self.fleet
        while line := await self._proc.stdout.readline():
            event = json.loads(line)
            kind = event["ev"]
            if kind == "start":
                self.fleet.start((event["job"], event["host"], event["lr"]))
            elif kind == "stop":
                self.fleet.kill((event["job"], event["host"], event["lr"]), 143)
            elif kind == "kill":
                self.fleet.kill((event["job"], event["host"], event["lr"]))
            elif kind == "discovered":
                self.discovered[event["job"]] = event["t"]
            elif kind == "published":
                self.published[(event["job"], event["round"])] = event["t"]
            elif kind == "ended":
                self.ended[event["job"]] = event
            elif kind == "stats" and self._stats is not None and not self._stats.done():
                self._stats.set_result(event)
            self.changed.set()

    async def stats(self) -> dict[str, Any]:
        self._stats = asyncio.get_running_loop().create_future()
        self.send({"op": "stats"})
        return await asyncio.wait_for(self._stats, 30)

    def add_job(
        self, job: str, hosts: dict[str, int], max_np: int, start_timeout_s: float = 120.0
    ) -> None:
        assert self.fleet is not None
        token = secrets.token_urlsafe(16)  # the job's key
        self.fleet.keys[job] = JobKey(token)
        settings = {"min_np": 1, "max_np": max_np, "heartbeat_timeout_s": self._heartbeat_timeout_s,
                    "start_timeout_s": start_timeout_s}  # fmt: skip
        self.send({"op": "add_job", "job": job, "token": token, "hosts": hosts,
                   "settings": settings})  # fmt: skip

    def set_hosts(self, job: str, hosts: dict[str, int]) -> None:
        self.send({"op": "set_hosts", "job": job, "hosts": hosts})

    async def until(self, done: Callable[[], bool], what: str, timeout_s: float) -> None:
        """Wait until ``done()``; raise TimeoutError naming ``what`` after ``timeout_s``."""
        assert self.fleet is not None
        deadline = time.monotonic() + timeout_s
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{what}: not done within {timeout_s:.0f} s")
            self.fleet.changed.clear()
            self.changed.clear()
            waits = [asyncio.ensure_future(e.wait()) for e in (self.fleet.changed, self.changed)]
            await asyncio.wait(waits, timeout=min(remaining, 1.0), return_when="FIRST_COMPLETED")
            for waiting in waits:
                waiting.cancel()


def hosts_of(prefix: str, first: int, count: int, slots: int) -> dict[str, int]:
    return {f"{prefix}{i:05d}": slots for i in range(first, first + count)}


def next_round(worker: SimWorker, after: int) -> float | None:
    """When the worker got its slot in the first round after ``after`` (None: not yet)."""
    times = [t for r, t in worker.log.assigned.items() if r > after]
    return min(times) if times else None
