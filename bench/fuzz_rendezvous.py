"""Fuzz campaign against the hardened rendezvous service on loopback (prints its figures).

One service serves four jobs: ``job-a`` and ``job-b`` (targets of the hostile requests; they
see no valid traffic, so any change of their state is caused by a rejected request),
``job-live`` (valid workers heartbeating, reading their round and holding notices long-polls
all along: the latency of their requests is measured under the load) and ``job-flood`` (sized
for one worker: floods over its rate and its long-poll bound).

Request classes: unknown workers, a worker speaking for another (with its own credential or
the reader token), future rounds, huge values, lax values, repeated keys, malformed JSON,
oversized bodies, other jobs' credentials, unknown jobs, wrong protocol versions,
floods over the rate, long-polls over the bound; plus slow clients that dribble their
headers over raw sockets.

Figures: requests sent, answers by status, 5xx count (a 503 with Retry-After is a deliberate
retry-later, counted apart), state changes caused by rejected
requests (each class's target jobs snapshotted before and after it), cross-job leaks (a 2xx
answer to another job's credential or an unknown job, or a body holding a key or a reader
token), RSS
before, after each of two passes of the hostile classes and at the end (one process: the
clients' memory is in it too), p50/p99 latency of valid requests under load (client and
service share one event loop, so this is an upper bound), long-polls held at once, and how
fast slow clients were cut off.

Usage: python bench/fuzz_rendezvous.py [--requests 12000] [--slow-clients 50]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import itertools
import json
import logging
import random
import resource
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from elasticjob.rendezvous.job_credentials import JobKey
from elasticjob.rendezvous.jobs import InMemoryJobRendezvous
from elasticjob.rendezvous.rendezvous_types import ProbeReport
from elasticjob.rendezvous.server import RendezvousService
from elasticjob.wire.messages import (
    HeldShards,
    NoticeKind,
    ProgressRequest,
    RendezvousRequest,
    ResultRequest,
    ScriptExit,
    SlotInfo,
    StepPace,
    WorkerId,
)
from elasticjob.wire.protocol import API_PREFIX, PROTOCOL_HEADER, PROTOCOL_VERSION

KEYS = {"job-a": "key-a-5f1e", "job-b": "key-b-77c2", "job-live": "key-live-0d9a",
        "job-flood": "key-flood-31b8"}  # fmt: skip


def credential(job: str, host: str) -> str:
    """The credential of ``host``'s worker(s) of ``job``."""
    return JobKey(KEYS[job]).worker_credential(host)


def reader(job: str) -> str:
    """``job``'s reader token."""
    return JobKey(KEYS[job]).reader_token()


SECRETS = [*KEYS.values(), *(reader(job) for job in KEYS)]
"""What an answer must never hold: a key, or a reader token (a worker credential names its
host, which answers do)."""
LIVE_WORKERS = 16
HEADER_TIMEOUT_S = 2.0
CUT_BOUND_S = 3 * HEADER_TIMEOUT_S
"""A slow client is cut within this (the service's header deadline, late by what the loop
it shares with the campaign's clients lags on a loaded machine: 3.45 s was seen), not held."""
PASSES = 2
FLOOD_BOUND = 20
"""A flood sends at most this many times its planned count while no 429 has come back."""
"""The hostile classes are sent in this many passes (RSS is read after each)."""


class Listener:
    """Counts what a job tells its driver."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def is_dismissed(self, worker: WorkerId) -> bool:
        return False

    def on_worker_ready(
        self,
        worker: WorkerId,
        after_round: int,
        *,
        rolled_back: bool,
        script_exit: ScriptExit | None = None,
        suspended: bool = False,
        held_shards: HeldShards | None = None,
    ) -> None:
        self.calls["ready"] += 1

    def on_worker_result(self, request: ResultRequest) -> None:
        self.calls["result"] += 1

    def on_progress(self, progress: ProgressRequest) -> None:
        self.calls["progress"] += 1

    def on_worker_heartbeat(
        self,
        worker: WorkerId,
        report: ProbeReport | None,
        pace: StepPace | None,
        held_shards: HeldShards | None = None,
    ) -> None:
        self.calls["heartbeat"] += 1


@dataclass
class Probe:
    """One hostile request: ``job`` in the path, with ``token`` and ``protocol``."""

    kind: str
    method: str
    job: str
    route: str
    token: str | None
    data: bytes | None = None
    protocol: str | None = str(PROTOCOL_VERSION)
    cross: bool = False
    """Sent with a credential that is not the path job's own (or to a job that does not
    exist)."""
    hostile: bool = True
    """Whether any 2xx answer to it is a hole (a flood's requests are valid but too many)."""


@dataclass
class Report:
    """The campaign's figures (see the module docstring)."""

    requests: int = 0
    by_status: Counter[int] = field(default_factory=Counter)
    by_kind: dict[str, Counter[int]] = field(default_factory=dict)
    server_errors: int = 0
    """5xx answers that are not a deliberate retry-later (503 with ``Retry-After``)."""
    retry_later: int = 0
    """503 answers with ``Retry-After``: a worker not admitted yet, asking for its round."""
    state_changes: list[str] = field(default_factory=list)
    cross_job_leaks: int = 0
    accepted_hostile: list[str] = field(default_factory=list)
    rss_before_kib: int = 0
    rss_after_pass_kib: list[int] = field(default_factory=list)
    """RSS after each pass of the hostile classes: flat from the second pass on if rejected
    requests leave nothing behind."""
    rss_after_kib: int = 0
    valid_requests: int = 0
    valid_p50_ms: float = 0.0
    valid_p99_ms: float = 0.0
    valid_failures: int = 0
    long_polls_held_max: int = 0
    long_polls_refused: int = 0
    slow_clients: int = 0
    slow_clients_cut_within_bound: int = 0
    slow_client_cut_max_s: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        out = dict(vars(self))
        out["by_status"] = dict(sorted(self.by_status.items()))
        out["by_kind"] = {k: dict(sorted(v.items())) for k, v in self.by_kind.items()}
        out["rss_growth_kib"] = self.rss_after_kib - self.rss_before_kib
        return out


def rss_kib() -> int:
    """Resident set size of this process, in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def job_state(job: InMemoryJobRendezvous, listener: Listener) -> object:
    """Everything a job keeps, as a comparable value."""
    skip = ("_bucket", "_round_changed", "_notices", "key", "_polls", "bodies", "_listener",
            "limits")  # fmt: skip
    kept = {k: copy.deepcopy(v) for k, v in vars(job).items() if k not in skip}
    notices = (job._notices.latest_seq, job._notices.after(0))  # the key never changes
    return (job.round_info(), job.long_polls, kept, notices, dict(listener.calls))


def body(**fields: object) -> bytes:
    return json.dumps(fields).encode()


def rendezvous_fields(host: str = "host-a", rank: int = 0) -> dict[str, object]:
    return {"hostname": host, "local_rank": rank, "address": "10.0.0.1", "store_port": 29500,
            "after_round": 0, "wait_seconds": 0}  # fmt: skip


def probes(rng: random.Random) -> dict[str, Callable[[], Probe]]:
    """Generators of hostile requests by class."""
    token = credential("job-a", "host-a")  # job-a's worker on host-a, rank 0 of round 1

    def planted() -> Probe:
        host = f"planted-{rng.randrange(10**9)}"
        route, data = rng.choice([
            ("rendezvous", body(**rendezvous_fields(host))),
            ("results", body(hostname=host, local_rank=0, state="FAILURE", message="x" * 4000)),
            ("heartbeat", body(hostname=host, local_rank=rng.randrange(1024))),
        ])  # fmt: skip
        return Probe("unknown worker", "POST", "job-a", route, credential("job-a", host), data)

    def another_worker() -> Probe:
        speaker = rng.choice([credential("job-a", f"pod-{rng.randrange(10**9)}"), reader("job-a")])
        route, data = rng.choice([
            ("rendezvous", body(**(rendezvous_fields() | {"address": "127.0.1.99"}))),
            ("rendezvous", body(**(rendezvous_fields() | {"suspended": True}))),
            ("results", body(hostname="host-a", local_rank=0, state="SUCCESS")),
            ("heartbeat", body(hostname="host-a", local_rank=0)),
            ("progress", body(round=1, epoch=12345, step=0)),
        ])  # fmt: skip
        return Probe("another worker", "POST", "job-a", route, speaker, data)

    def future_round() -> Probe:
        after = rng.choice([2, 3, 10**6, 2**62])  # job-a is at round 1
        if rng.random() < 0.5:
            data = body(**(rendezvous_fields() | {"after_round": after}))
            return Probe("future round", "POST", "job-a", "rendezvous", token, data)
        data = body(round=after, epoch=0, step=0)
        return Probe("future round", "POST", "job-a", "progress", token, data)

    def huge() -> Probe:
        change = rng.choice([{"store_port": 10**30}, {"local_rank": 10**6},
                             {"wait_seconds": 1e308}, {"hostname": "h" * 300},
                             {"address": "a" * 10_000}, {"after_round": -1},
                             {"wait_seconds": 61}])  # fmt: skip
        data = body(**(rendezvous_fields() | change))
        return Probe("huge value", "POST", "job-a", "rendezvous", token, data)

    def lax() -> Probe:
        field_name, value = rng.choice([("local_rank", True), ("local_rank", "0"),
                                        ("local_rank", 0.0), ("store_port", "29500"),
                                        ("rolled_back", 1), ("after_round", False)])  # fmt: skip
        data = body(**(rendezvous_fields() | {field_name: value}))
        return Probe("lax value", "POST", "job-a", "rendezvous", token, data)

    def repeated_key() -> Probe:
        data = b'{"hostname": "host-a", "local_rank": 0, "local_rank": 5}'
        return Probe("repeated key", "POST", "job-a", "heartbeat", token, data)

    def malformed() -> Probe:
        data = rng.choice([b"{not json", b"", b"[]", b"null", b"[" * 5000, bytes(range(256))])
        return Probe("malformed JSON", "POST", "job-a", rng.choice(["rendezvous", "results"]),
                     token, data)  # fmt: skip

    def oversized() -> Probe:
        data = b'{"message": "' + b"x" * (70 * 1024) + b'"}'
        return Probe("oversized body", "POST", "job-a", "results", token, data)

    def other_token() -> Probe:
        route = rng.choice(["round", "notices"])
        speaker = rng.choice([reader("job-b"), credential("job-b", "host-a"), KEYS["job-a"]])
        return Probe("other job's token", "GET", "job-a", route, speaker, cross=True)

    def unknown_job() -> Probe:
        job = rng.choice(["job-c", "job-live-2", "kube-system.x", "a" * 253])
        return Probe("unknown job", "GET", job, "round", reader("job-a"), cross=True)

    def protocol() -> Probe:
        newer = str(PROTOCOL_VERSION + 1)
        version = rng.choice([None, "0", newer, "99", "abc", "-1", "9" * 40])
        probe = Probe("protocol version", "GET", "job-a", "round", token)
        probe.protocol = version
        return probe

    return {"unknown worker": planted, "another worker": another_worker,
            "future round": future_round, "huge value": huge,
            "lax value": lax, "repeated key": repeated_key, "malformed JSON": malformed,
            "oversized body": oversized, "other job's token": other_token,
            "unknown job": unknown_job, "protocol version": protocol}  # fmt: skip


class Campaign:
    """The service, its jobs, and the traffic sent to them."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.service = RendezvousService(header_timeout=HEADER_TIMEOUT_S)
        self.listeners = {job: Listener() for job in KEYS}
        self.jobs = {
            job: self.service.add_job(
                job, key, self.listeners[job], max_workers=1 if job == "job-flood" else 1024
            )
            for job, key in KEYS.items()
        }
        self.live = [WorkerId(f"live-{i}", 0) for i in range(LIVE_WORKERS)]
        self.jobs["job-live"].readmit(self.live)
        self.jobs["job-a"].readmit([WorkerId("host-a", 0)])
        self.report = Report()
        self.latencies: list[float] = []
        self.stop_live = asyncio.Event()

    def url(self, job: str, route: str) -> str:
        return f"{self.service.url}{API_PREFIX}/jobs/{job}/{route}"

    @staticmethod
    def headers(token: str | None, protocol: str | None) -> dict[str, str]:
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        if protocol is not None:
            headers[PROTOCOL_HEADER] = protocol
        return headers

    async def send(self, session: aiohttp.ClientSession, probe: Probe) -> None:
        async with session.request(
            probe.method,
            self.url(probe.job, probe.route),
            data=probe.data,
            headers=self.headers(probe.token, probe.protocol),
        ) as response:
            text = await response.text()
        self.report.requests += 1
        self.report.by_status[response.status] += 1
        self.report.by_kind.setdefault(probe.kind, Counter())[response.status] += 1
        if response.status == 503 and "Retry-After" in response.headers:
            self.report.retry_later += 1
        elif response.status >= 500:
            self.report.server_errors += 1
        if response.status < 400 and probe.hostile:
            self.report.accepted_hostile.append(f"{probe.kind}: {probe.route} {response.status}")
            if probe.cross:
                self.report.cross_job_leaks += 1
        if probe.token and any(t in text for t in SECRETS):
            self.report.cross_job_leaks += 1

    async def run_class(
        self, session: aiohttp.ClientSession, kind: str, make: Callable[[], Probe], count: int
    ) -> None:
        """Send ``count`` probes of one class, 32 at a time; compare job-a and job-b before
        and after (nothing valid reaches them)."""
        targets = ("job-a", "job-b")
        before = {job: job_state(self.jobs[job], self.listeners[job]) for job in targets}
        sent = 0
        while sent < count:
            batch = min(32, count - sent)
            await asyncio.gather(*(self.send(session, make()) for _ in range(batch)))
            sent += batch
        for job in targets:
            if job_state(self.jobs[job], self.listeners[job]) != before[job]:
                self.report.state_changes.append(f"{kind} changed {job}")

    async def flood(self, session: aiohttp.ClientSession, count: int) -> None:
        """Requests to job-flood far over its rate: the first burst passes, then 429. At
        least ``count``, and on until the first 429 (a loaded machine may send slower than
        the bucket refills), at most :data:`FLOOD_BOUND` times ``count``."""
        before = job_state(self.jobs["job-flood"], self.listeners["job-flood"])
        sent = 0
        while sent < count or (
            sent < FLOOD_BOUND * count
            and self.report.by_kind.get("flood over the rate", Counter())[429] == 0
        ):
            sent += 64
            await asyncio.gather(*(
                self.send(session, Probe("flood over the rate", "GET", "job-flood", "round",
                                         reader("job-flood"), hostile=False))
                for _ in range(64)
            ))  # fmt: skip
        if job_state(self.jobs["job-flood"], self.listeners["job-flood"]) != before:
            self.report.state_changes.append("flood changed job-flood")

    async def long_polls(self, live_polls: int) -> None:
        """Hold ``live_polls`` notices long-polls on job-live, and twice job-flood's bound on
        job-flood (the excess is refused with 429), each on its own connection."""
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            await self._hold_long_polls(session, live_polls)

    async def _hold_long_polls(self, session: aiohttp.ClientSession, live_polls: int) -> None:
        flood = self.jobs["job-flood"]
        bound = flood.limits.long_polls
        outcomes: Counter[int] = Counter()

        async def poll(job: str) -> None:
            url = self.url(job, "notices") + "?after=0&wait=20"
            headers = self.headers(reader(job), str(PROTOCOL_VERSION))
            async with session.get(url, headers=headers) as response:
                outcomes[response.status] += 1
                await response.read()

        tasks = [asyncio.create_task(poll("job-live")) for _ in range(live_polls)]
        tasks += [asyncio.create_task(poll("job-flood")) for _ in range(2 * bound)]
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            held = self.jobs["job-live"].long_polls + flood.long_polls
            self.report.long_polls_held_max = max(self.report.long_polls_held_max, held)
            if self.jobs["job-live"].long_polls == live_polls and outcomes[429] >= bound:
                break
        self.report.long_polls_refused = outcomes[429]
        for job in ("job-live", "job-flood"):
            self.jobs[job].post_notice(NoticeKind.HOSTS_ADDED, ())  # answers every poll
        await asyncio.wait_for(asyncio.gather(*tasks), 30)

    async def live_traffic(self, session: aiohttp.ClientSession) -> None:
        """Valid requests of job-live's workers, timed, until the campaign ends."""
        cycle: Iterator[WorkerId] = itertools.cycle(self.live)
        while not self.stop_live.is_set():
            worker = next(cycle)
            route, data, method = rng_choice(self.rng, worker)
            started = time.perf_counter()
            async with session.request(
                method, self.url("job-live", route), data=data,
                headers=self.headers(credential("job-live", worker.hostname),
                                     str(PROTOCOL_VERSION)),
            ) as response:  # fmt: skip
                await response.read()
            self.latencies.append(time.perf_counter() - started)
            self.report.valid_requests += 1
            if response.status >= 300:
                self.report.valid_failures += 1
            await asyncio.sleep(0.002)

    async def slow_clients(self, count: int) -> None:
        """Open ``count`` connections that dribble a header byte every 0.3 s; time how long
        the service takes to cut each one."""

        async def dribble() -> float:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.service.port)
            started = time.monotonic()
            writer.write(b"POST /v1/jobs/job-a/rendezvous HTTP/1.1\r\nHost: x\r\n")
            try:
                while time.monotonic() - started < 4 * HEADER_TIMEOUT_S:
                    writer.write(b"X")
                    await writer.drain()
                    try:
                        if await asyncio.wait_for(reader.read(1), 0.3) == b"":
                            break
                    except TimeoutError:
                        continue
            except OSError:
                pass
            finally:
                writer.close()
            return time.monotonic() - started

        cuts = await asyncio.gather(*(dribble() for _ in range(count)))
        self.report.slow_clients = count
        self.report.slow_clients_cut_within_bound = sum(c <= CUT_BOUND_S for c in cuts)
        self.report.slow_client_cut_max_s = round(max(cuts, default=0.0), 2)

    async def start_job_a(self) -> None:
        """job-a runs a round of its own (host-a[0]), as a job under attack would."""
        job, worker = self.jobs["job-a"], WorkerId("host-a", 0)
        fields = rendezvous_fields() | {"address": "10.0.0.1"}
        await job.rendezvous(RendezvousRequest.model_validate(fields))
        slot = SlotInfo(hostname=worker.hostname, rank=0, local_rank=0, cross_rank=0,
                             size=1, local_size=1, cross_size=1)  # fmt: skip
        job.publish_round(1, {worker: slot}, sync=True)

    async def run(self, requests: int, slow: int, live_polls: int) -> Report:
        await self.service.start("127.0.0.1", 0)
        await self.start_job_a()
        try:
            connector = aiohttp.TCPConnector(limit=256)
            timeout = aiohttp.ClientTimeout(total=60)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
                gc.collect()
                self.report.rss_before_kib = rss_kib()
                live = asyncio.create_task(self.live_traffic(session))
                classes = probes(self.rng)
                flood = max(requests // 10, 256)
                per_class = max(1, (requests - flood) // len(classes) // PASSES)
                slow_task = asyncio.create_task(self.slow_clients(slow))
                for _ in range(PASSES):
                    for kind, make in classes.items():
                        await self.run_class(session, kind, make, per_class)
                    gc.collect()
                    self.report.rss_after_pass_kib.append(rss_kib())
                await self.long_polls(live_polls)
                await self.flood(session, flood)
                await slow_task
                self.stop_live.set()
                await live
                gc.collect()
                self.report.rss_after_kib = rss_kib()
        finally:
            await self.service.stop()
        ordered = sorted(self.latencies)
        if ordered:
            self.report.valid_p50_ms = round(1000 * statistics.median(ordered), 2)
            self.report.valid_p99_ms = round(1000 * ordered[int(0.99 * (len(ordered) - 1))], 2)
        return self.report


def rng_choice(rng: random.Random, worker: WorkerId) -> tuple[str, bytes | None, str]:
    """One valid request of a live worker: a heartbeat, its round, or the notices."""
    kind = rng.choice(["heartbeat", "round", "notices"])
    if kind == "heartbeat":
        return "heartbeat", body(hostname=worker.hostname, local_rank=worker.local_rank), "POST"
    return (kind if kind == "round" else "notices?after=0&wait=0"), None, "GET"


async def run_campaign(requests: int, slow_clients: int, live_polls: int, seed: int = 8) -> Report:
    """Run the campaign (see the module docstring) and return its figures."""
    return await Campaign(seed).run(requests, slow_clients, live_polls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=12_000)
    parser.add_argument("--slow-clients", type=int, default=50)
    parser.add_argument("--long-polls", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=8)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # a cut-off slow client is a warning each
    report = asyncio.run(run_campaign(args.requests, args.slow_clients, args.long_polls, args.seed))
    print(json.dumps(report.as_dict(), indent=2, default=str))


if __name__ == "__main__":
    main()
