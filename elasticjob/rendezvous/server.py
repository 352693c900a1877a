"""The rendezvous service: one aiohttp application serving the rounds and notices of many jobs.

The HTTP API is documented in ``docs/rendezvous-api.yaml``; the routes live in ``routes.py``,
the per-job bounds in ``limits.py``, TLS and the header deadline in ``transport.py``.
"""

from __future__ import annotations

import gc
import logging
import ssl
import time
from collections.abc import Callable, Iterable
from typing import Final

from aiohttp import web

from elasticjob.rendezvous.jobs import InMemoryJobRendezvous
from elasticjob.rendezvous.limits import DEFAULT_MAX_WORKERS, JobLimits
from elasticjob.rendezvous.rendezvous_types import RendezvousListener
from elasticjob.rendezvous.request_bodies import BODY_TIMEOUT_S
from elasticjob.rendezvous.routes import create_app
from elasticjob.rendezvous.stats import RequestStats
from elasticjob.rendezvous.transport import (
    HEADER_TIMEOUT_S,
    ConnectionCounts,
    GuardedSite,
    protocol_logger,
    raise_open_files_limit,
)

logger = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT_S: Final = 5.0
"""How long :meth:`RendezvousService.stop` waits for requests in progress to be answered."""

GC_THRESHOLDS: Final = (20_000, 20, 20)
"""The garbage collector's thresholds in a process serving the rendezvous (at least these;
Python's are 700, 10, 10). Every request allocates hundreds of objects and the service holds
a long-poll per worker, so with Python's thresholds full collections of a growing heap came
often: at 1,024 simulated workers the collector took about a fifth of the service's CPU,
about 5 % with these (``bench/scale.py``)."""


class RendezvousService:
    """Hosts the rendezvous of many jobs in one aiohttp application.

    Use :meth:`start` / :meth:`stop` to serve it on its own, or mount :attr:`app` in another
    application (then that application's shutdown answers pending long-polls).
    """

    def __init__(
        self,
        *,
        shutdown_timeout: float = SHUTDOWN_TIMEOUT_S,
        header_timeout: float = HEADER_TIMEOUT_S,
        body_timeout: float = BODY_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._jobs: dict[str, InMemoryJobRendezvous] = {}
        self._stats = RequestStats()
        self._clock = clock
        self._expected: set[str] = set()
        self._expected_until = 0.0
        self._standing_by = False
        self._app = create_app(self._jobs, self._stats, self.adopting, body_timeout=body_timeout)
        self._shutdown_timeout = shutdown_timeout
        self._header_timeout = header_timeout
        self._scheme = "http"
        self._runner: web.AppRunner | None = None
        self._connections = ConnectionCounts()
        self._host = ""
        self._port: int | None = None
        self._stopped = False

    @property
    def app(self) -> web.Application:
        """The aiohttp application (``/healthz`` and the ``/v1`` job routes)."""
        return self._app

    @property
    def stats(self) -> RequestStats:
        """Per-route request counters and latency sums."""
        return self._stats

    @property
    def connections(self) -> ConnectionCounts:
        """The connections accepted since the service started, and those open now (a copy)."""
        return ConnectionCounts(self._connections.accepted, self._connections.open)

    def add_job(
        self,
        job: str,
        key: str,
        listener: RendezvousListener,
        *,
        max_workers: int = DEFAULT_MAX_WORKERS,
        heartbeat_interval_s: float | None = 1.0,
    ) -> InMemoryJobRendezvous:
        """Serve a new job whose credentials derive from ``key`` (``job_credentials.py``);
        its bounds (rate, long-polls, see ``limits.py``) are sized for at most
        ``max_workers`` workers beating every ``heartbeat_interval_s`` (None: they do not
        beat).

        Raises :class:`ValueError` if a job of that name is served already, the name is not a
        valid job name, the key is not printable ASCII without spaces, or ``max_workers < 1``.
        """
        if job in self._jobs:
            raise ValueError(f"job {job!r} already exists")
        limits = JobLimits.for_workers(max_workers, heartbeat_interval_s)
        rendezvous = InMemoryJobRendezvous(job, key, listener, limits=limits, clock=self._clock)
        self._jobs[job] = rendezvous
        self._expected.discard(job)
        logger.info("serving job %s", job)
        return rendezvous

    def expect_jobs(self, jobs: Iterable[str], within_s: float) -> None:
        """After a restart: until every job in ``jobs`` is served again (:meth:`add_job`), or
        for ``within_s`` at most, answer requests for jobs that are not served (yet) with 503
        and ``Retry-After`` instead of 403, so that their workers retry rather than give up."""
        self._expected = set(jobs) - set(self._jobs)
        self._expected_until = self._clock() + within_s
        if self._expected:
            logger.info(
                "expecting %d jobs back within %.0f s: %s",
                len(self._expected),
                within_s,
                ", ".join(sorted(self._expected)),
            )

    def also_expect(self, jobs: Iterable[str]) -> None:
        """Add ``jobs`` to those expected back (:meth:`expect_jobs`), within the window already
        running (nothing once it has run out)."""
        if self._clock() < self._expected_until:
            self._expected |= set(jobs) - set(self._jobs)

    def stand_by(self) -> None:
        """Another operator leads: answer every job's requests with 503 and ``Retry-After``
        (its workers retry, and reach the leader) until :meth:`lead`."""
        self._standing_by = True

    def lead(self, jobs: Iterable[str], within_s: float) -> None:
        """This operator leads (again): serve the jobs added from now on, and answer those of
        ``jobs`` not served yet as :meth:`expect_jobs` says."""
        self._standing_by = False
        self.expect_jobs(jobs, within_s)

    @property
    def standing_by(self) -> bool:
        """Whether another operator leads (:meth:`stand_by`)."""
        return self._standing_by

    def adopting(self) -> bool:
        """Whether requests for jobs that are not served get 503 (retry): another operator
        leads, or jobs expected back (:meth:`expect_jobs`) are still missing."""
        if self._standing_by:
            return True
        if self._expected and self._clock() >= self._expected_until:
            logger.warning(
                "jobs not back in time, answering 403 for them from now on: %s",
                ", ".join(sorted(self._expected)),
            )
            self._expected = set()
        return bool(self._expected)

    def serves(self, job: str) -> bool:
        """Whether ``job`` is served (added, and neither removed nor released)."""
        return job in self._jobs

    def remove_job(self, job: str) -> None:
        """Stop serving ``job``: finish it (its pending long-polls get ``FINISHED``) and answer
        403 to its later requests. Does nothing for a job that is not served."""
        rendezvous = self._jobs.pop(job, None)
        if rendezvous is not None:
            rendezvous.finish("the job was removed from the rendezvous service")
            logger.info("stopped serving job %s", job)

    def release_job(self, job: str) -> None:
        """Stop serving ``job`` without finishing it: another operator takes it over. Its
        pending long-polls are answered now as if their wait ran out, and its later requests
        get what a job that is not served gets (503 while standing by)."""
        rendezvous = self._jobs.pop(job, None)
        if rendezvous is not None:
            rendezvous.close_waits()
            logger.info("released job %s to another operator", job)

    async def start(
        self, host: str, port: int = 0, *, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        """Listen on ``host``:``port`` (0: any free port), over TLS with ``ssl_context`` (a
        server context holding the service's certificate); returns once listening.
        Connections are kept alive between requests; one that has not sent a request's headers
        within the header timeout (the first request's from when it opened, a later one's
        from the previous answer: the keep-alive idle timeout) is closed.

        A service starts once: if it cannot bind, it is stopped (the error propagates)."""
        if self._runner is not None or self._stopped:
            raise RuntimeError("the rendezvous service can be started only once")
        gc.set_threshold(*map(max, gc.get_threshold(), GC_THRESHOLDS))
        raise_open_files_limit()
        runner = web.AppRunner(
            self._app,
            handle_signals=False,
            shutdown_timeout=self._shutdown_timeout,
            logger=protocol_logger(),
            # Also the bound on a kept-alive connection's next request headers (transport.py).
            keepalive_timeout=self._header_timeout,
        )
        await runner.setup()
        site = GuardedSite(
            runner, host, port, ssl_context=ssl_context, header_timeout=self._header_timeout
        )
        try:
            await site.start()
        except BaseException:
            self._stopped = True
            await runner.cleanup()
            raise
        self._runner = runner
        self._connections = site.connections
        self._scheme = "https" if ssl_context is not None else "http"
        self._host = host
        self._port = int(runner.addresses[0][1])
        logger.info("rendezvous service listening on %s", self.url)

    async def stop(self) -> None:
        """Stop listening, answer pending long-polls at once (``PENDING`` for rendezvous, the
        notices so far for notices) and wait at most the shutdown timeout for requests in
        progress. Jobs are not finished: their workers retry against a new service."""
        runner, self._runner = self._runner, None
        self._stopped = True
        if runner is not None:
            await runner.cleanup()
            logger.info("rendezvous service stopped")

    @property
    def serving(self) -> bool:
        """Whether the service listens (between :meth:`start` and :meth:`stop`)."""
        return self._runner is not None

    @property
    def port(self) -> int:
        """The port the service listens on (after :meth:`start`)."""
        if self._port is None:
            raise RuntimeError("the rendezvous service is not started")
        return self._port

    @property
    def url(self) -> str:
        """``http://host:port`` (``https://`` with TLS) of the service (after :meth:`start`)."""
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"{self._scheme}://{host}:{self.port}"
