"""Scale benchmark of the rendezvous service and the elastic driver with simulated workers
(prints its figures and the curve against N; asserts nothing).

The real rendezvous service and one real driver per job run in a child process, as under the
operator (``sim_service.py``); this process runs N simulated workers (``sim_worker.py``:
asyncio clients of the real protocol, heartbeats included, no torch) and the scenarios. A
fresh service process serves each size, so its peak RSS is that size's. Scenarios per N:

- ``start``:     a job of N workers is created -> every worker has its slot in round 1;
- ``fail``:      a worker is killed (exit 137) -> every survivor has heard ROUND_FAILED
                 (``notice``) -> every survivor has its slot in the next round (``fail``);
- ``scale-out``: N/10 workers' hosts appear -> every worker has its slot in the next round
                 (timed from the moment the hosts are pushed to the driver, as the operator
                 pushes its pods);
- ``scale-in``:  N/10 workers' hosts vanish -> every remaining worker has its slot in the next
                 round and the leavers have exited (timed from the push, as above);
- ``multi``:     10 jobs of N/10 workers created at once -> every worker has its slot;
- ``idle``:      5 s of the running job (heartbeats, progress, notice long-polls).

Latency is per worker (p50, p99 and max over the workers of the scenario), from the
scenario's start. ``svc cpu`` is the service process's CPU seconds during the scenario, and
``requests`` the requests it answered.

Usage: python bench/scale.py [--sizes 64,256,1024] [--slots 1] [--plot scale.png]
Run it niced (``nice -n 5``) on a shared machine and say the load average with its figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import resource
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.sim_cluster import ServiceProcess, hosts_of, next_round  # noqa: E402
from bench.sim_worker import Fleet, Key, SimWorker  # noqa: E402

SCENARIO_TIMEOUT_S = 120.0
JOB_END_TIMEOUT_S = 60.0
IDLE_S = 5.0
SETTLE_S = 2.0


@dataclass
class Row:
    """One scenario's figures at one size."""

    size: int
    scenario: str
    latencies: list[float]
    svc_cpu_s: float
    requests: int
    errors: int
    gen_cpu_s: float
    beats: int = 0
    """Of ``requests``, the heartbeats (the steady load: one per worker per interval)."""
    driver_steps: int = 0
    driver_cpu_s: float = 0.0
    """The drivers' steps during the scenario and their CPU (part of ``svc_cpu_s``)."""
    note: str = ""

    def pct(self, q: float) -> float:
        if not self.latencies:
            return math.nan
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


@dataclass
class SizeRun:
    """The scenarios at one size, against one service process."""

    svc: ServiceProcess
    size: int
    slots: int
    rows: list[Row] = field(default_factory=list)
    timed_out: bool = False
    """A scenario did not end in time: the job's state is unknown, the size's run stops."""

    @property
    def fleet(self) -> Fleet:
        assert self.svc.fleet is not None
        return self.svc.fleet

    def placed_in_round_1(self, expected: set[Key], since: float) -> list[float] | None:
        """How long after ``since`` each of the ``expected`` workers got its place in round 1,
        or None while one has not."""
        got = [
            self.fleet.workers[k].log.assigned.get(1) for k in expected if k in self.fleet.workers
        ]
        if len(got) < len(expected) or None in got:
            return None
        return [t - since for t in got if t is not None]

    def workers(self, job: str, hosts: Iterable[str]) -> list[SimWorker]:
        wanted = set(hosts)
        return [w for w in self.fleet.running(job) if w.host in wanted]

    async def measure(
        self, scenario: str, act: Callable[[], Any], done: Callable[[], list[float] | None],
        note: str | Callable[[], str] = "",
    ) -> Row:  # fmt: skip
        """Run ``act`` and wait until ``done()`` returns the latencies; record the row with
        ``note`` (called once done, if it is a function)."""
        before, gen_before = await self.svc.stats(), _own_cpu()
        await asyncio.sleep(0)
        act()
        found: list[float] = []

        def finished() -> bool:
            nonlocal found
            result = done()
            if result is None:
                return False
            found = result
            return True

        try:
            await self.svc.until(finished, f"{scenario} at N={self.size}", SCENARIO_TIMEOUT_S)
            note = note() if callable(note) else note
        except TimeoutError:
            note = f"TIMED OUT after {SCENARIO_TIMEOUT_S:.0f} s"
            self.timed_out = True
        after = await self.svc.stats()
        row = Row(
            self.size, scenario, found, after["cpu_s"] - before["cpu_s"],
            after["requests"] - before["requests"], after["errors"] - before["errors"],
            _own_cpu() - gen_before, _beats(after) - _beats(before),
            after["driver_steps"] - before["driver_steps"],
            after["driver_cpu_s"] - before["driver_cpu_s"], note,
        )  # fmt: skip
        self.rows.append(row)
        print(_format_row(row), flush=True)
        return row

    def _published(self, job: str, round_number: int, since: float) -> str:
        """When the driver published the round, after ``since``."""
        published = self.svc.published.get((job, round_number))
        return "" if published is None else f"published at {published - since:.3f} s"

    async def start_job(self, job: str, hosts: dict[str, int], scenario: str) -> None:
        expected = {(job, h, lr) for h, n in hosts.items() for lr in range(n)}
        t0 = 0.0

        def act() -> None:
            nonlocal t0
            t0 = time.monotonic()
            self.svc.add_job(job, hosts, max_np=self.size * 2)

        def done() -> list[float] | None:
            return self.placed_in_round_1(expected, t0)

        await self.measure(scenario, act, done, lambda: self._published(job, 1, t0))

    async def fail_one(self, job: str, hosts: dict[str, int]) -> None:
        names = list(hosts)
        victim_host = names[len(names) // 2]
        victim = (job, victim_host, 0)
        survivors = [w for w in self.fleet.running(job) if w.host != victim_host]
        before = max(w.round for w in survivors)
        t0 = 0.0

        def act() -> None:
            nonlocal t0
            t0 = time.monotonic()
            self.fleet.kill(victim)

        def heard() -> list[float] | None:
            got = [w.log.failed_heard.get(before) for w in survivors]
            return None if None in got else [t - t0 for t in got if t is not None]

        def formed() -> list[float] | None:
            if heard() is None:
                return None
            got = [next_round(w, before) for w in survivors]
            return None if None in got else [t - t0 for t in got if t is not None]

        row = await self.measure("fail", act, formed, lambda: self._published(job, before + 1, t0))
        notices = heard() or []
        self.rows.insert(self.rows.index(row), Row(
            self.size, "notice", notices, row.svc_cpu_s, row.requests, row.errors, row.gen_cpu_s,
            row.beats, row.driver_steps, row.driver_cpu_s, "(cost: see fail)",
        ))  # fmt: skip
        print(_format_row(self.rows[-2]), flush=True)
        del hosts[victim_host]

    async def resize(self, job: str, hosts: dict[str, int], new_hosts: dict[str, int]) -> None:
        scenario = "scale-out" if len(new_hosts) > len(hosts) else "scale-in"
        staying = [w for w in self.fleet.running(job) if w.host in new_hosts]
        leaving = [w for w in self.fleet.running(job) if w.host not in new_hosts]
        before = max(w.round for w in staying)
        newcomers = {(job, h, lr) for h in new_hosts if h not in hosts for lr in range(self.slots)}
        self.svc.discovered.pop(job, None)

        def done() -> list[float] | None:
            members = staying + [
                self.fleet.workers[k] for k in newcomers if k in self.fleet.workers
            ]
            if len(members) < len(staying) + len(newcomers) or job not in self.svc.discovered:
                return None
            if any(w.log.ended_at is None for w in leaving):
                return None
            got = [next_round(w, before) for w in members]
            if None in got:
                return None
            seen = self.svc.discovered[job]
            return [t - seen for t in got if t is not None]

        await self.measure(
            scenario,
            lambda: self.svc.set_hosts(job, new_hosts),
            done,
            lambda: self._published(job, before + 1, self.svc.discovered[job]),
        )
        hosts.clear()
        hosts.update(new_hosts)

    async def idle(self, job: str) -> None:
        def act() -> None:
            self._idle_until = time.monotonic() + IDLE_S

        await self.measure(
            "idle", act, lambda: [] if time.monotonic() >= self._idle_until else None
        )

    _idle_until: float = 0.0

    async def end_jobs(self, jobs: list[str]) -> None:
        for job in jobs:
            self.fleet.finish(job)
        await self.svc.until(
            lambda: all(j in self.svc.ended for j in jobs), "jobs ending", JOB_END_TIMEOUT_S
        )
        failed = [self.svc.ended[j] for j in jobs if not self.svc.ended[j]["success"]]
        if failed:
            print(f"  jobs failed: {failed}", flush=True)


def _beats(stats: dict[str, Any]) -> int:
    return sum(n for route, n in stats["routes"].items() if route.endswith("/heartbeat"))


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _format_row(row: Row) -> str:
    lat = "" if not row.latencies else (
        f"{row.pct(0.5):8.3f} {row.pct(0.99):8.3f} {max(row.latencies):8.3f}"
    )  # fmt: skip
    return (
        f"{row.size:>6} {row.scenario:<10} {lat:<26} {row.svc_cpu_s:8.2f} {row.requests:>9}"
        f" {row.beats:>6} {row.errors:>6} {row.gen_cpu_s:8.2f} {row.driver_steps:>6}"
        f" {row.driver_cpu_s:8.2f} {row.note}"
    )


HEADER = (
    f"{'N':>6} {'scenario':<10} {'p50 s':>8} {'p99 s':>8} {'max s':>8} {'svc cpu':>8}"
    f" {'requests':>9} {'beats':>6} {'errors':>6} {'gen cpu':>8} {'steps':>6} {'drv cpu':>8}"
)


async def run_size(size: int, slots: int, heartbeat_timeout_s: float | None, log_dir: Path,
                   scenarios: Iterable[str]) -> tuple[list[Row], dict[str, Any]]:  # fmt: skip
    """Run ``scenarios`` at ``size`` workers against a fresh service process; return the rows
    and the service's final stats."""
    wanted = set(scenarios)
    async with ServiceProcess(heartbeat_timeout_s, log_dir / f"service-{size}.log") as svc:
        run = SizeRun(svc, size, slots)
        job = f"scale-n{size}"
        hosts = hosts_of("h", 0, max(1, size // slots), slots)
        await run.start_job(job, hosts, "start")
        await asyncio.sleep(SETTLE_S)
        if run.timed_out:
            return run.rows, await svc.stats()
        if "idle" in wanted:
            await run.idle(job)
        if "fail" in wanted and not run.timed_out:
            await run.fail_one(job, hosts)
            await asyncio.sleep(SETTLE_S)
        step = max(1, round(size / 10 / slots))
        if "scale-out" in wanted and not run.timed_out:
            grown = dict(hosts) | hosts_of("n", 0, step, slots)
            await run.resize(job, hosts, grown)
            await asyncio.sleep(SETTLE_S)
        if "scale-in" in wanted and not run.timed_out:
            shrunk = dict(list(hosts.items())[:-step])
            await run.resize(job, hosts, shrunk)
            await asyncio.sleep(SETTLE_S)
        if not run.timed_out:
            await run.end_jobs([job])
        if "multi" in wanted and not run.timed_out:
            jobs = [f"multi-n{size}-{i}" for i in range(10)]
            per_job = max(1, size // 10 // slots)
            t0 = 0.0
            expected = {
                (j, h, lr)
                for j in jobs
                for h in hosts_of("m", 0, per_job, slots)
                for lr in range(slots)
            }

            def act() -> None:
                nonlocal t0
                t0 = time.monotonic()
                for j in jobs:
                    svc.add_job(j, hosts_of("m", 0, per_job, slots), max_np=size)

            def done() -> list[float] | None:
                return run.placed_in_round_1(expected, t0)

            await run.measure("multi", act, done, note=f"10 jobs x {per_job * slots}")
            await asyncio.sleep(SETTLE_S)
            await run.end_jobs(jobs)
        final = await svc.stats()
    return run.rows, final


def print_curve(rows: list[Row], sizes: list[int], peaks: dict[int, dict[str, Any]]) -> None:
    """p99 and service CPU per scenario against N, with ratios to the smallest N, the
    requests other than heartbeats (what the scenario's event costs) plus the heartbeats
    that fell in it, and the service's CPU per request."""
    print("\ncurve (ratios against the smallest N; N grew", " / ".join(
        f"x{s / sizes[0]:.0f}" for s in sizes), ")")  # fmt: skip
    by = {(r.size, r.scenario): r for r in rows}
    for scenario in dict.fromkeys(r.scenario for r in rows):
        base = by.get((sizes[0], scenario))
        cells = []
        for size in sizes:
            row = by.get((size, scenario))
            if row is None or base is None:
                cells.append("-")
                continue
            p99, base_p99 = row.pct(0.99), base.pct(0.99)
            ratio = f"x{p99 / base_p99:.1f}" if base_p99 and not math.isnan(p99) else ""
            cpu_ratio = f"x{row.svc_cpu_s / base.svc_cpu_s:.1f}" if base.svc_cpu_s > 0 else ""
            per_request = 1000 * row.svc_cpu_s / row.requests if row.requests else math.nan
            cells.append(
                f"p99 {p99:.3f} {ratio} cpu {row.svc_cpu_s:.2f} {cpu_ratio} "
                f"({row.requests - row.beats}+{row.beats} beats, {per_request:.2f} ms/req)"
            )
        print(f"  {scenario:<10} " + " | ".join(cells))
    print("  peak RSS   " + " | ".join(f"{peaks[s]['maxrss_kib'] / 1024:.0f} MiB" for s in sizes))
    print("  requests   " + " | ".join(f"{peaks[s]['requests']}" for s in sizes))


def plot(rows: list[Row], sizes: list[int], path: Path) -> None:
    try:
        import matplotlib  # noqa: PLC0415 (an optional dependency)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        print("(matplotlib is not installed: no picture; pip install elasticjob[plot])")
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    by = {(r.size, r.scenario): r for r in rows}
    for i, scenario in enumerate(dict.fromkeys(r.scenario for r in rows if r.latencies)):
        xs = [s for s in sizes if (s, scenario) in by]
        style = {"marker": "o", "label": scenario, "color": f"C{i}"}
        axes[0].plot(xs, [by[(s, scenario)].pct(0.99) for s in xs], **style)
        if scenario != "notice":
            axes[1].plot(xs, [by[(s, scenario)].svc_cpu_s for s in xs], **style)
    for ax, title in zip(axes, ("p99 latency (s)", "service CPU (s)"), strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers (N)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"picture: {path}")


SCENARIOS = ("idle", "fail", "scale-out", "scale-in", "multi")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,256,1024")
    parser.add_argument("--slots", type=int, default=1, help="slots (workers) per host")
    parser.add_argument("--heartbeat-timeout", type=float, default=5.0,
                        help="the driver's heartbeat timeout (0: no heartbeats)")  # fmt: skip
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--plot", type=Path, help="write a PNG of the curve here")
    parser.add_argument("--json", type=Path, help="write every row here")
    parser.add_argument("--log-dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    scenarios = args.scenarios.split(",")
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}, {os.cpu_count()} CPUs,"
          f" nice {os.nice(0)}; service log: {args.log_dir}/service-N.log")  # fmt: skip
    print(HEADER)
    rows: list[Row] = []
    finals: dict[int, dict[str, Any]] = {}
    for size in sizes:
        found, final = asyncio.run(
            run_size(size, args.slots, args.heartbeat_timeout or None, args.log_dir, scenarios)
        )
        rows += found
        finals[size] = final
        print(f"{size:>6} service peak RSS {final['maxrss_kib'] / 1024:.0f} MiB, "
              f"{final['requests']} requests over {final['connections']} connections, "
              f"CPU {final['cpu_s']:.1f} s of which garbage collection {final['gc_s']:.2f} s",
              flush=True)  # fmt: skip
    print_curve(rows, sizes, finals)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        args.json.write_text(
            json.dumps([r.__dict__ | {"p50": r.pct(0.5), "p99": r.pct(0.99)} for r in rows])
        )
    if args.plot:
        plot(rows, sizes, args.plot)


if __name__ == "__main__":
    main()
