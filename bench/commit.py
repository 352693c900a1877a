"""What a commit of a ~100 MB model + optimizer state costs (the standalone runtime, one
torch thread).

1. The copy itself: a commit (``TorchState.commit()``, snapshot buffers reused) against a
   plain ``copy_`` of the same number of bytes between two warm flat buffers, and against
   the clone + deep-copy commit that preceded the snapshot buffers. Ratio = memcpy time /
   commit time (the share of memcpy bandwidth a commit reaches).
2. In a training loop: the step time with a commit after every step, synchronous and with
   ``background_commit=True``, against the same loop without commits, in interleaved blocks
   (the machine's load drifts). Overhead = median step time / median without commits - 1;
   also the time the training thread is blocked by commits: in ``commit()`` and, with a
   background copy, waiting for it before the next ``optimizer.step()`` (the rest of a
   background copy's cost is the memory bandwidth and caches it shares with the step).

Run: ``nice -n 5 .venv/bin/python bench/commit.py``; it prints figures and ratios only.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from collections.abc import Callable

import torch

import elasticjob.worker_runtime as hvd
from elasticjob.worker_runtime.elastic import TorchState

WIDTH = 2048


def model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """An MLP of 12.6 M parameters (50 MB) and SGD with momentum (50 MB more once stepped)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, WIDTH),
        torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, 10),
    )
    return model, torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)


def stepper(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: int
) -> Callable[[], None]:
    x = torch.randn(batch, WIDTH)
    y = torch.randint(0, 10, (batch,))

    def step() -> None:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()

    return step


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    tensors = list(model.state_dict().values()) + [
        t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)
    ]
    return sum(t.numel() * t.element_size() for t in tensors)


def median_seconds(action: Callable[[], object], repeats: int) -> float:
    action()  # warm
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def timed_step(step: Callable[[], object], commit: Callable[[], object]) -> tuple[float, float]:
    """Run one training step, then one commit: the seconds of both, and of the commit."""
    started = time.perf_counter()
    step()
    committing = time.perf_counter()
    commit()
    ended = time.perf_counter()
    return ended - started, ended - committing


def copy_costs(repeats: int) -> None:
    model, optimizer = model_and_optimizer()
    stepper(model, optimizer, 8)()  # momentum buffers exist
    size = state_bytes(model, optimizer)
    src = torch.ones(size, dtype=torch.uint8)
    dst = torch.empty_like(src)
    memcpy = median_seconds(lambda: dst.copy_(src), repeats)
    state = TorchState(model, optimizer, epoch=0)
    commit = median_seconds(state.commit, repeats)

    def clone_and_deepcopy() -> None:
        _ = {k: v.detach().clone() for k, v in model.state_dict().items()}
        _ = copy.deepcopy(optimizer.state_dict())

    previous = median_seconds(clone_and_deepcopy, repeats)
    mb = size / 1e6
    print(f"state: {mb:.1f} MB (model + SGD momentum), median of {repeats}")
    print(f"  memcpy (copy_ between warm buffers): {memcpy * 1e3:7.1f} ms  {mb / memcpy:6.0f} MB/s")
    print(
        f"  commit (snapshot buffers):          {commit * 1e3:7.1f} ms  {mb / commit:6.0f} MB/s"
        f"  -> {memcpy / commit:.0%} of memcpy bandwidth"
    )
    print(
        f"  clone + deepcopy (before):          {previous * 1e3:7.1f} ms  {mb / previous:6.0f} MB/s"
        f"  -> {memcpy / previous:.0%} of memcpy bandwidth"
    )


def step_costs(batch: int, blocks: int, steps: int) -> None:
    model, optimizer = model_and_optimizer()
    step = stepper(model, optimizer, batch)
    step()
    plain = TorchState(model, optimizer, epoch=0)
    # Step pre-hooks run in order: the state's hook (waiting for a copy) between these two.
    hook_started = [0.0]
    waited: list[float] = []
    optimizer.register_step_pre_hook(lambda *_: hook_started.__setitem__(0, time.perf_counter()))
    background = TorchState(model, optimizer, background_commit=True, epoch=0)
    optimizer.register_step_pre_hook(
        lambda *_: waited.append(time.perf_counter() - hook_started[0])
    )
    modes: dict[str, Callable[[], None]] = {
        "no commit": lambda: None,
        "commit every step": plain.commit,
        "commit every step, background": background.commit,
    }
    totals: dict[str, list[float]] = {mode: [] for mode in modes}
    in_commit: dict[str, list[float]] = {mode: [] for mode in modes}
    for block in range(blocks + 1):  # the first block warms up
        for mode, commit in modes.items():
            commit()
            background.restore()  # waits for a background copy in flight
            for _ in range(steps):
                waited.clear()
                total, committing = timed_step(step, commit)
                if block:
                    totals[mode].append(total)
                    in_commit[mode].append(committing + sum(waited))
    base = statistics.median(totals["no commit"])
    print(f"step time (batch {batch}, {blocks} interleaved blocks of {steps} steps, median):")
    for mode, samples in totals.items():
        median = statistics.median(samples)
        blocked = statistics.median(in_commit[mode])
        print(
            f"  {mode:31s} {median * 1e3:7.1f} ms  overhead {median / base - 1:+6.1%}"
            f"  (blocked in commit() and the wait before the next optimizer step "
            f"{blocked * 1e3:5.1f} ms = {blocked / base:5.1%} of the step)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    for name in [n for n in os.environ if n.startswith("ELASTICJOB_")]:
        del os.environ[name]
    torch.set_num_threads(1)
    hvd.init()
    print(f"load average at start: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} cores")
    copy_costs(args.repeats)
    step_costs(args.batch, args.blocks, args.steps)
    print(f"load average at end: {os.getloadavg()[0]:.2f} (1 min)")
    hvd.shutdown()


if __name__ == "__main__":
    main()
