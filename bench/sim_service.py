"""The service side of the scale benchmark: the real rendezvous service and one real elastic
driver per job, in one process, as the operator (and ``elasticjob-run``) run them.

Run as ``python -m bench.sim_service`` by ``bench/scale.py``. It speaks JSON lines with its
parent: commands on stdin, events on stdout (logs go to stderr). The drivers launch their
workers through :class:`SimLauncher`, which asks the parent to start simulated workers
(``sim_worker.py``) instead of processes, and are told their hosts when the parent sets them
(as the operator pushes its pods); the parent reports each simulated worker's exit back, as a
launcher reports a process's exit. Everything else is the production code.

Commands: ``add_job`` (job, token, hosts, settings), ``set_hosts`` (job, hosts), ``exit``
(job, host, local_rank, code), ``stats``, ``quit``. Events: ``ready`` (url), ``start`` /
``stop`` / ``kill`` (job, host, local_rank), ``discovered`` (job, t), ``published`` (job,
round, size, t), ``ended`` (job, success, message), ``stats`` (cpu_s, maxrss_kib, rss_kib,
requests, connections accepted).

With ``SIM_UNCAPPED_RATE`` set, every job gets the bounds the service gave jobs before it
capped any job's rate at a share of the service (:func:`uncapped`, for ``fair_share.py``).
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import json
import logging
import os
import resource
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from elasticjob.driver.blacklist import Blacklist, BlacklistPolicy
from elasticjob.driver.driver import ElasticDriver
from elasticjob.driver.driver_types import DriverSettings, WorkerLauncher
from elasticjob.driver.host_manager import HostManager
from elasticjob.rendezvous.limits import DEFAULT_MAX_WORKERS, JobLimits
from elasticjob.rendezvous.rendezvous_types import JobRendezvous, RendezvousListener
from elasticjob.rendezvous.server import RendezvousService
from elasticjob.wire.messages import SlotInfo, WorkerId

logger = logging.getLogger("sim_service")

Event = dict[str, Any]
UNCAPPED_ENV = "SIM_UNCAPPED_RATE"


def uncapped(max_workers: int, heartbeat_interval_s: float | None = 1.0) -> JobLimits:
    """A job's bounds as the service sized them before it capped any job's rate: 30
    requests a second per worker (30,720 at 1,024), a burst of 2 s, no bound on bodies (its
    workers' heartbeats made no difference)."""
    rate = max(100.0, 30.0 * max_workers)
    return JobLimits(requests_per_s=rate, burst=2 * rate, long_polls=max(20, 20 * max_workers),
                     bodies=10**9)  # fmt: skip


_GC_SECONDS = [0.0, 0.0]
"""Seconds spent in the cyclic garbage collector so far, and when the running one began."""


def _time_gc(phase: str, info: dict[str, int]) -> None:
    del info
    if phase == "start":
        _GC_SECONDS[1] = time.process_time()
    else:
        _GC_SECONDS[0] += time.process_time() - _GC_SECONDS[1]


class Emitter:
    """Writes events to stdout as JSON lines (from the event loop or, thread-safely, not)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._out = sys.stdout

    def emit(self, event: Event) -> None:
        self._out.write(json.dumps(event) + "\n")
        self._out.flush()

    def emit_threadsafe(self, event: Event) -> None:
        self._loop.call_soon_threadsafe(self.emit, event)


class SimLauncher(WorkerLauncher):
    """Asks the parent to start and stop simulated workers; their exits come back as
    ``exit`` commands (:meth:`ElasticDriver.on_worker_exit`)."""

    def __init__(self, job: str, emitter: Emitter) -> None:
        self._job = job
        self._emitter = emitter

    def _emit(self, ev: str, worker: WorkerId) -> None:
        self._emitter.emit({"ev": ev, "job": self._job, "host": worker[0], "lr": worker[1]})

    async def start(self, worker: WorkerId, planned: SlotInfo) -> None:
        self._emit("start", worker)

    async def stop(self, worker: WorkerId) -> None:
        self._emit("stop", worker)

    async def kill(self, worker: WorkerId, reason: str) -> None:
        logger.warning("killing %s: %s", worker, reason)
        self._emit("kill", worker)

    async def stop_all(self) -> None:
        self._emitter.emit({"ev": "stop_all", "job": self._job})


class PublishObserver:
    """A :class:`~elasticjob.driver.driver_types.DriverObserver` telling the parent when a round is
    published (the operator's observer turns the same calls into histograms)."""

    def __init__(self, job: str, driver: ElasticDriver, emitter: Emitter) -> None:
        self._job = job
        self._driver = driver
        self._emitter = emitter

    def round_formed(self, seconds: float) -> None:
        self._emitter.emit(
            {"ev": "published", "job": self._job, "round": self._driver.round,
             "size": len(self._driver.slots), "t": time.monotonic(), "formed_s": seconds}
        )  # fmt: skip

    def recovered(self, seconds: float) -> None:
        del seconds

    def committed(self, seconds: float) -> None:
        del seconds


class SimOperator:
    """The jobs of this process: their drivers over one rendezvous service."""

    def __init__(self, service: RendezvousService, emitter: Emitter) -> None:
        self._service = service
        self._emitter = emitter
        self._drivers: dict[str, ElasticDriver] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._steps = 0
        self._step_cpu_s = 0.0

    def add_job(self, job: str, token: str, hosts: dict[str, int], settings: Event) -> None:
        driver_settings = DriverSettings(**settings)

        def rendezvous(listener: RendezvousListener) -> JobRendezvous:
            return self._service.add_job(
                job, token, listener, max_workers=driver_settings.max_np or DEFAULT_MAX_WORKERS
            )

        driver = ElasticDriver(
            HostManager(Blacklist[str](BlacklistPolicy(60.0, 600.0))),
            lambda _: SimLauncher(job, self._emitter),
            rendezvous,
            driver_settings,
            time.monotonic,
        )
        driver.journal.observer = PublishObserver(job, driver, self._emitter)
        driver.step = self._timed(driver.step)  # type: ignore[method-assign]
        self._drivers[job] = driver
        driver.update_hosts(hosts)
        task = asyncio.create_task(self._run(job, driver), name=f"driver {job}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _timed(self, step: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        """The driver's step, counted and timed (its share of the service's CPU)."""

        async def timed() -> None:
            started = time.process_time()
            try:
                await step()
            finally:
                self._steps += 1
                self._step_cpu_s += time.process_time() - started

        return timed

    async def _run(self, job: str, driver: ElasticDriver) -> None:
        try:
            result = await driver.run()
            event = {"ev": "ended", "job": job, "success": result.success, "message": ""}
            if not result.success:
                event["message"] = result.message[:2000]
        except Exception as exc:  # reported to the parent, which fails the run
            logger.exception("driver of %s failed", job)
            event = {"ev": "ended", "job": job, "success": False, "message": repr(exc)}
        self._service.remove_job(job)
        self._drivers.pop(job, None)
        self._emitter.emit(event)

    def set_hosts(self, job: str, hosts: dict[str, int]) -> None:
        driver = self._drivers.get(job)
        if driver is not None:
            driver.update_hosts(hosts)
            self._emitter.emit({"ev": "discovered", "job": job, "t": time.monotonic()})

    def exit(self, job: str, host: str, local_rank: int, code: int) -> None:
        driver = self._drivers.get(job)
        if driver is not None:
            driver.on_worker_exit(WorkerId(host, local_rank), code)

    def stats(self) -> Event:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        with open("/proc/self/statm") as statm:
            rss_pages = int(statm.read().split()[1])
        routes = self._service.stats.snapshot()
        return {
            "ev": "stats",
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "maxrss_kib": usage.ru_maxrss,
            "rss_kib": rss_pages * os.sysconf("SC_PAGE_SIZE") // 1024,
            "requests": sum(r.requests for r in routes.values()),
            "connections": self._service.connections.accepted,
            "gc_s": _GC_SECONDS[0],
            "driver_steps": self._steps,
            "driver_cpu_s": self._step_cpu_s,
            "errors": sum(r.errors for r in routes.values()),
            "routes": {name: r.requests for name, r in routes.items()},
        }


async def serve() -> None:
    gc.callbacks.append(_time_gc)
    if os.environ.get(UNCAPPED_ENV):
        JobLimits.for_workers = uncapped  # type: ignore[method-assign]
    loop = asyncio.get_running_loop()
    emitter = Emitter(loop)
    service = RendezvousService()
    await service.start("127.0.0.1", 0)
    if threshold := os.environ.get("SIM_GC_THRESHOLD"):  # to compare with other thresholds
        gc.set_threshold(*map(int, threshold.split(",")))
    operator = SimOperator(service, emitter)
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    emitter.emit({"ev": "ready", "url": service.url, "pid": os.getpid()})
    try:
        while line := await reader.readline():
            command = json.loads(line)
            op = command.pop("op")
            if op == "quit":
                break
            if op == "add_job":
                operator.add_job(**command)
            elif op == "set_hosts":
                operator.set_hosts(**command)
            elif op == "exit":
                operator.exit(**command)
            elif op == "stats":
                emitter.emit(operator.stats())
            else:
                raise ValueError(f"unknown command {op!r}")
    finally:
        await service.stop()


def main() -> None:
    level = os.environ.get("SIM_SERVICE_LOG", "WARNING")
    logging.basicConfig(
        level=level, stream=sys.stderr, format="svc %(levelname)s %(name)s: %(message)s"
    )
    profile_path = os.environ.get("SIM_SERVICE_PROFILE")
    if not profile_path:
        asyncio.run(serve())
        return
    profiler = cProfile.Profile()
    try:
        profiler.runcall(asyncio.run, serve())
    finally:
        profiler.dump_stats(profile_path)


if __name__ == "__main__":
    main()
