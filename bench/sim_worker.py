"""Simulated workers for the scale benchmark: asyncio clients of the real rendezvous protocol
(``docs/rendezvous-api.yaml``), no torch.

A :class:`SimWorker` does what a worker process's runtime does over HTTP: it asks for the
round (``GET round``, and ``GET plan`` when the job runs already), registers and long-polls
for its round, follows the job's notices by long-poll, beats a heartbeat at the job's
interval, reports progress once a second as rank 0, and on a notice leaves its round the way
a training loop does: a ``ROUND_FAILED`` of its round as a rollback (``rolled_back``), a hosts
notice newer than its round at the next step. It exits when told ``REMOVED`` or
``FINISHED``, or after reporting success when the benchmark finishes the job.

A :class:`Fleet` is the benchmark's side of the launcher: it starts and kills simulated
workers as the drivers ask and tells the service process how each ended.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from elasticjob.backoff import Backoff
from elasticjob.rendezvous.job_credentials import JobKey
from elasticjob.wire.protocol import API_PREFIX, PROTOCOL_HEADER, PROTOCOL_VERSION

logger = logging.getLogger("sim_worker")

RENDEZVOUS_WAIT_S = 20.0
NOTICES_WAIT_S = 20.0
PROGRESS_INTERVAL_S = 1.0
_BACKOFF = Backoff(initial_s=0.05, factor=2.0, max_s=2.0)
"""The pauses between a request's tries, as the worker runtime's client makes them."""
KILLED_EXIT_CODE = 137
TERMINATED_EXIT_CODE = 143

Key = tuple[str, str, int]
"""A simulated worker: (job, host, local rank)."""


class Refused(Exception):
    """The service refused a request for good."""


@dataclass
class WorkerLog:
    """When things happened to one simulated worker (``time.monotonic()``)."""

    assigned: dict[int, float] = field(default_factory=dict)
    """Round -> when the worker got its slot in it."""
    failed_heard: dict[int, float] = field(default_factory=dict)
    """Round -> when the worker heard that round failed."""
    hosts_heard: dict[int, float] = field(default_factory=dict)
    """Notice sequence -> when the worker heard of a hosts notice."""
    rank: int | None = None
    exit_code: int | None = None
    ended_at: float | None = None


class HttpClient:
    """Where the service listens; opens :class:`HttpConnection` s to it."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        assert parts.scheme == "http" and parts.hostname and parts.port
        self._host, self._port = parts.hostname, parts.port
        self._host_header = f"Host: {parts.netloc}\r\n"

    def connection(self) -> HttpConnection:
        return HttpConnection(self._host, self._port, self._host_header)


class HttpConnection:
    """A minimal HTTP/1.1 client over asyncio streams that keeps its connection open between
    requests, as a worker's client does for each of its threads: one request at a time, the
    connection re-opened when the service has closed it (idle, or after a refusal), and a
    request that fails on a reused connection that the service closed meanwhile sent once
    more on a fresh one. It sends the same bytes a worker's client sends at a fraction of
    aiohttp's client cost, so that one load generator process can play a thousand workers
    beside the service on a small machine."""

    def __init__(self, host: str, port: int, host_header: str) -> None:
        self._host, self._port, self._host_header = host, port, host_header
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None

    async def request(
        self, method: str, path: str, headers: str, body: bytes, timeout_s: float
    ) -> tuple[int, float | None, bytes]:
        """The answer's status, its ``Retry-After`` (seconds) and its body."""
        message = (
            f"{method} {path} HTTP/1.1\r\n{self._host_header}{headers}"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        async with asyncio.timeout(timeout_s):
            if self._streams is not None and self._streams[0].at_eof():
                self.close()  # the service closed it while it was idle
            reused = self._streams is not None
            try:
                return await self._exchange(message)
            except (ConnectionError, asyncio.IncompleteReadError):
                self.close()
                if not reused:
                    raise
            except BaseException:
                self.close()
                raise
            try:
                return await self._exchange(message)
            except BaseException:
                self.close()
                raise

    async def _exchange(self, message: bytes) -> tuple[int, float | None, bytes]:
        if self._streams is None:
            self._streams = await asyncio.open_connection(self._host, self._port)
        reader, writer = self._streams
        writer.write(message)
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split(" ", 2)[1])
        fields = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        payload = await reader.readexactly(int(fields.get("content-length", "0")))
        if fields.get("connection", "").lower() == "close":
            self.close()
        retry_after = fields.get("retry-after")
        return status, float(retry_after) if retry_after is not None else None, payload


class SimWorker:
    """One simulated worker process (see the module docstring)."""

    def __init__(
        self,
        key: Key,
        token: str,
        http: HttpClient,
        heartbeat_interval_s: float | None,
        on_change: Callable[[SimWorker], None],
    ) -> None:
        self.key = key
        self.job, self.host, self.local_rank = key
        self.log = WorkerLog()
        self._base = f"{API_PREFIX}/jobs/{self.job}"
        self._headers = (
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            f"{PROTOCOL_HEADER}: {PROTOCOL_VERSION}\r\n"
        )
        self._http = http
        self._connections: dict[str, HttpConnection] = {}
        """One kept-alive connection per task (a worker's client keeps one per thread)."""
        self._heartbeat_s = heartbeat_interval_s
        self._on_change = on_change
        self._beat = json.dumps({"hostname": self.host, "local_rank": self.local_rank}).encode()
        self.round = 0
        self._handled_seq = 0
        self._latest_hosts_seq = 0
        self._max_failed_round = 0
        self._interrupt = asyncio.Event()
        self._finish = False

    def finish(self) -> None:
        """End training: report success and exit 0 (what makes the job succeed)."""
        self._finish = True
        self._interrupt.set()

    async def _call(
        self, method: str, path: str, body: Any = None, wait_s: float = 0.0, task: str = "main"
    ) -> Any:
        """One request over ``task``'s connection, retried like the worker runtime's client
        retries (connection errors, 5xx and 429, honouring ``Retry-After``)."""
        connection = self._connections.get(task)
        if connection is None:
            connection = self._connections[task] = self._http.connection()
        data = (
            b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
        )
        pauses = _BACKOFF.delays()
        while True:
            pause = next(pauses)
            try:
                status, retry_after, payload = await connection.request(
                    method, self._base + path, self._headers, data, wait_s + 30.0
                )
                if status < 300:
                    return json.loads(payload) if payload else None
                if status != 429 and status < 500:
                    raise Refused(f"{method} {path} -> {status}: {payload[:300]!r}")
                pause = retry_after if retry_after is not None else pause
            except (OSError, TimeoutError, ValueError) as exc:
                logger.debug("%s %s failed: %r; retrying", method, path, exc)
            await asyncio.sleep(pause)

    async def run(self) -> int:
        """Live until dismissed, finished or cancelled (killed); return the exit code."""
        tasks = [asyncio.create_task(self._follow_notices())]
        if self._heartbeat_s:
            tasks.append(asyncio.create_task(self._heartbeats(self._heartbeat_s)))
        progress: asyncio.Task[None] | None = None
        try:
            info = await self._call("GET", "/round")
            if info["round"] > 0:
                await self._call("GET", "/plan")
            after, rolled_back = 0, False
            while True:
                answer = await self._call(
                    "POST",
                    "/rendezvous",
                    {"hostname": self.host, "local_rank": self.local_rank, "address": "127.0.0.1",
                     "store_port": 20000 + self.local_rank, "after_round": after,
                     "wait_seconds": RENDEZVOUS_WAIT_S, "rolled_back": rolled_back},
                    wait_s=RENDEZVOUS_WAIT_S,
                )  # fmt: skip
                status = answer["status"]
                if status in ("REMOVED", "FINISHED"):
                    return 0
                if status == "PENDING":
                    continue
                after = answer["round"]
                if after <= self._max_failed_round:
                    continue  # the round failed before it formed; wait for the next
                self.round, self._handled_seq = after, answer["notice_seq"]
                self.log.assigned[after] = time.monotonic()
                self.log.rank = answer["slot"]["rank"]
                self._on_change(self)
                if progress is not None:
                    progress.cancel()
                if self.log.rank == 0:
                    progress = asyncio.create_task(self._report_progress(after))
                rolled_back = await self._train()
                if self._finish:
                    await self._call(
                        "POST",
                        "/results",
                        {"hostname": self.host, "local_rank": self.local_rank, "state": "SUCCESS"},
                    )
                    return 0
        finally:
            for task in [*tasks, *([progress] if progress else [])]:
                task.cancel()
            for connection in self._connections.values():
                connection.close()  # a process's sockets close with it
            self.log.ended_at = time.monotonic()

    async def _train(self) -> bool:
        """Train until something interrupts the round; return whether it rolled back."""
        while True:
            if self._finish:
                return False
            if self._max_failed_round >= self.round:
                return True
            if self._latest_hosts_seq > self._handled_seq:
                return False
            self._interrupt.clear()
            await self._interrupt.wait()

    async def _follow_notices(self) -> None:
        after = 0
        while True:
            answer = await self._call(
                "GET",
                f"/notices?after={after}&wait={NOTICES_WAIT_S}",
                wait_s=NOTICES_WAIT_S,
                task="notices",
            )
            now = time.monotonic()
            for notice in answer["notices"]:
                if notice["seq"] <= after:
                    continue
                if notice["kind"] == "ROUND_FAILED":
                    self.log.failed_heard.setdefault(notice["round"], now)
                    self._max_failed_round = max(self._max_failed_round, notice["round"])
                else:
                    self.log.hosts_heard[notice["seq"]] = now
                    self._latest_hosts_seq = max(self._latest_hosts_seq, notice["seq"])
                self._interrupt.set()
                self._on_change(self)
            after = max(after, answer["latest_seq"])

    async def _heartbeats(self, interval_s: float) -> None:
        next_beat = time.monotonic()
        while True:
            try:
                await self._call("POST", "/heartbeat", self._beat, task="heartbeat")
            except Refused as exc:
                logger.debug("heartbeat refused: %s", exc)
            next_beat = max(next_beat + interval_s, time.monotonic())
            await asyncio.sleep(next_beat - time.monotonic())

    async def _report_progress(self, round_number: int) -> None:
        step = 0
        while True:
            step += 1
            body = {"round": round_number, "epoch": 0, "step": step, "samples_per_second": 1.0,
                    "resumed": step == 1}  # fmt: skip
            try:
                await self._call("POST", "/progress", body, task="progress")
            except Refused as exc:
                logger.debug("progress refused: %s", exc)
            await asyncio.sleep(PROGRESS_INTERVAL_S)


class Fleet:
    """The simulated workers of every job: started and killed as the drivers ask;
    ``report_exit(key, code)`` tells the service process how each ended."""

    def __init__(
        self,
        url: str,
        report_exit: Callable[[Key, int], None],
        heartbeat_interval_s: float | None,
    ) -> None:
        self._url = url
        self._report_exit = report_exit
        self._heartbeat_s = heartbeat_interval_s
        self.keys: dict[str, JobKey] = {}
        """Each job's key, from which its workers' credentials derive (a simulated job's)."""
        self.credentials: dict[tuple[str, str], str] = {}
        """A worker's own credential by (job, host), where it is handed one (a pod's)."""
        self.workers: dict[Key, SimWorker] = {}
        """The latest simulated worker of each key (running or not)."""
        self._tasks: dict[Key, asyncio.Task[int]] = {}
        self.changed = asyncio.Event()
        """Set whenever a worker got a slot, heard a notice or ended (scenarios wait on it)."""
        self._http = HttpClient(url)

    async def __aenter__(self) -> Fleet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def running(self, job: str | None = None) -> list[SimWorker]:
        return [w for k, w in self.workers.items() if k in self._tasks and job in (None, k[0])]

    def start(self, key: Key) -> None:
        if key in self._tasks:
            logger.warning("%s started twice", key)
            return
        job, host, _ = key
        token = self.credentials.get((job, host)) or self.keys[job].worker_credential(host)
        worker = SimWorker(key, token, self._http, self._heartbeat_s, self._notify)
        self.workers[key] = worker
        task = asyncio.create_task(worker.run(), name=f"sim {key}")
        self._tasks[key] = task
        task.add_done_callback(lambda done: self._ended(key, worker, done))

    def _notify(self, _: SimWorker) -> None:
        self.changed.set()

    def _ended(self, key: Key, worker: SimWorker, task: asyncio.Task[int]) -> None:
        if task.cancelled():
            code = worker.log.exit_code or KILLED_EXIT_CODE
        elif task.exception() is not None:
            logger.error("simulated worker %s failed: %r", key, task.exception())
            code = 1
        else:
            code = task.result()
        worker.log.exit_code = code
        if self._tasks.get(key) is task:
            del self._tasks[key]
        self._report_exit(key, code)
        self.changed.set()

    def kill(self, key: Key, code: int = KILLED_EXIT_CODE) -> None:
        """End the worker at once (a SIGKILL: no result, no goodbye)."""
        task = self._tasks.get(key)
        if task is not None:
            self.workers[key].log.exit_code = code
            task.cancel()

    def finish(self, job: str) -> None:
        """Every running worker of ``job`` reports success and exits 0."""
        for worker in self.running(job):
            worker.finish()
