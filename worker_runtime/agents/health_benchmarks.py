"""The micro-benchmarks of a pod's health check: its compute (a matrix multiply), its copy
bandwidth (host memory on a CPU, host to device on a GPU) and one collective with the other
pods of its cohort. Each is bounded in time, and each checks its own answer: a wrong result
raises :class:`BenchmarkBroken` (a broken device), a failed collective
:class:`CollectiveBroken`. The members of a cohort measure in turns (pods that share a
machine would otherwise measure each other).

On a GPU pod every visible device is measured and the slowest one's figures are reported
(one bad GPU is enough to slow every step of the job).
"""

from __future__ import annotations

import datetime
import math
import time
from collections.abc import Callable
from typing import Final

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore, Store

from elasticjob.wire.health import HealthFigures

WINDOWS: Final = 4
WINDOW_S: Final = 0.125
"""A timed benchmark runs :data:`WINDOWS` windows of this long (at least one iteration
each, whatever it takes)."""
_CPU_MATRIX: Final = 256
_GPU_MATRIX: Final = 4096
_COPY_BYTES: Final = 32 * 1024 * 1024
_COLLECTIVE_ELEMENTS: Final = 256 * 1024
_COLLECTIVE_REPEATS: Final = 3
TURNS: Final = 8
"""Most turns a cohort measures in (a member's turn: its rank modulo this)."""


class BenchmarkBroken(RuntimeError):
    """A micro-benchmark computed a wrong result, or could not run."""


class CollectiveBroken(RuntimeError):
    """The cohort's collective failed, timed out or summed wrongly."""


def _best_rate(step: Callable[[], object], sync: Callable[[], None]) -> float:
    """Iterations of ``step`` per second: the best of :data:`WINDOWS` windows of
    :data:`WINDOW_S` each (at least one iteration each). The best, as what others running on
    the machine take away comes and goes; a window longer than a CFS period (100 ms), so a
    CPU quota shows in every window."""
    step()  # warm up
    sync()
    best = 0.0
    for _ in range(WINDOWS):
        started = time.perf_counter()
        iterations = 0
        while True:
            step()
            iterations += 1
            sync()
            elapsed = time.perf_counter() - started
            if elapsed >= WINDOW_S:
                break
        best = max(best, iterations / elapsed)
    return best


def _sync_of(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def compute_gflops(device: torch.device) -> float:
    """GFLOP/s of a float32 matrix multiply on ``device`` (one thread on a CPU, so pods
    compare core to core), after checking that it multiplies correctly."""
    n = _GPU_MATRIX if device.type == "cuda" else _CPU_MATRIX
    generator = torch.Generator().manual_seed(0)
    a = torch.rand(n, n, generator=generator).to(device)
    twice = torch.eye(n, device=device) * 2
    if not torch.equal(a @ twice, a * 2):
        raise BenchmarkBroken(f"a matrix multiply on {device} gave a wrong result")
    b = torch.rand(n, n, generator=generator).to(device)
    out = torch.empty(n, n, device=device)
    rate = _best_rate(lambda: torch.mm(a, b, out=out), _sync_of(device))
    return 2.0 * n**3 * rate / 1e9


def copy_gbps(device: torch.device) -> float:
    """GB/s of copying :data:`_COPY_BYTES` into ``device`` (host memory to host memory on a
    CPU, pinned host memory to the device on a GPU), after checking that the copy arrived."""
    elements = _COPY_BYTES // 4
    source = torch.arange(elements, dtype=torch.float32)
    if device.type == "cuda":
        source = source.pin_memory()
    target = torch.empty(elements, dtype=torch.float32, device=device)
    rate = _best_rate(lambda: target.copy_(source, non_blocking=True), _sync_of(device))
    if not torch.equal(target[-16:].cpu(), source[-16:]):
        raise BenchmarkBroken(f"a copy to {device} arrived wrong")
    return _COPY_BYTES * rate / 1e9


def _devices() -> list[torch.device]:
    if torch.cuda.is_available():
        return [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    return [torch.device("cpu")]


def measure(collective_s: float | None) -> HealthFigures:
    """The pod's figures: the slowest visible device's compute and copy (see the module
    docstring). Raises :class:`BenchmarkBroken`."""
    devices = _devices()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        compute = min(compute_gflops(d) for d in devices)
        copy = min(copy_gbps(d) for d in devices)
    except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
        if isinstance(exc, BenchmarkBroken):
            raise
        raise BenchmarkBroken(f"{type(exc).__name__}: {exc}") from exc
    finally:
        torch.set_num_threads(threads)
    if not (math.isfinite(compute) and math.isfinite(copy)) or compute <= 0 or copy <= 0:
        raise BenchmarkBroken(f"implausible figures: {compute} GFLOP/s, {copy} GB/s")
    return HealthFigures(
        device=devices[0].type, compute_gflops=compute, copy_gbps=copy, collective_s=collective_s
    )


def measure_in_cohort(
    store: Store, prefix: str, rank: int, size: int, timeout: datetime.timedelta
) -> HealthFigures:
    """Form a Gloo group of the cohort on ``store`` (keys under ``prefix``), all-reduce a
    1 MiB tensor :data:`_COLLECTIVE_REPEATS` times checking the sum, then :func:`measure` in
    turns: at most :data:`TURNS` turns, each member measuring in the turn of its rank, so
    that members sharing a machine do not measure each other. Raises
    :class:`CollectiveBroken` and :class:`BenchmarkBroken`."""
    try:
        dist.init_process_group(
            "gloo",
            store=PrefixStore(prefix, store),
            rank=rank,
            world_size=size,
            timeout=timeout,
        )
    except (RuntimeError, dist.DistError) as exc:
        raise CollectiveBroken(f"the cohort's group did not form: {exc}") from exc
    try:
        collective_s = _all_reduce_seconds(rank, size)
        figures: HealthFigures | None = None
        broken: BenchmarkBroken | None = None
        for turn in range(min(size, TURNS)):
            if rank % TURNS == turn:
                try:
                    figures = measure(collective_s)
                except BenchmarkBroken as exc:
                    broken = exc  # still in the turns' barriers: the others wait for them
            dist.barrier()
    except (RuntimeError, dist.DistError) as exc:
        if isinstance(exc, CollectiveBroken):
            raise
        raise CollectiveBroken(f"the cohort's collectives failed: {exc}") from exc
    finally:
        dist.destroy_process_group()
    if broken is not None:
        raise broken
    assert figures is not None
    return figures


def _all_reduce_seconds(rank: int, size: int) -> float:
    """The fastest of :data:`_COLLECTIVE_REPEATS` all-reduces, each checked."""
    expected = float(size * (size + 1) // 2)
    best = math.inf
    for _ in range(_COLLECTIVE_REPEATS):
        tensor = torch.full((_COLLECTIVE_ELEMENTS,), float(rank + 1))
        started = time.perf_counter()
        dist.all_reduce(tensor)
        best = min(best, time.perf_counter() - started)
        if not torch.all(tensor == expected):
            raise CollectiveBroken(f"the all-reduce summed wrongly (expected {expected:g})")
    return best
