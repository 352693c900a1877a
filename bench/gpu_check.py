"""Everything one GPU can show, in one command (``make gpu-check``), within 10 minutes; a
clear skip on a machine without CUDA. Prints its figures and writes them to ``docs/gpu.md``.

1. the CUDA-only tests (``tests/integration/test_gpu_job.py``: NCCL under ``elasticjob-run``,
   restart mode on NCCL);
2. NCCL in a world of one: a group's init, its first collective, its abort, and a new
   group's init and first collective after the abort (what a survivor pays per round);
3. the sharded state on CUDA: the FSDP2 example (``examples/sharded_lm/train.py``) under
   ``elasticjob-run`` on one GPU, one-dimensional and HSDP (``--hsdp``), to its end;
4. a commit's snapshot from the GPU to host memory (``shard_snapshot.take_snapshot``)
   against a plain ``Tensor.to("cpu")`` of the same bytes.

Usage: python bench/gpu_check.py [--no-write]
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "gpu.md"
STEP_TIMEOUT_S = 150
"""Each job's bound: three of them and the rest fit in 10 minutes."""


def run(command: list[str], timeout_s: float = STEP_TIMEOUT_S) -> tuple[bool, float, str]:
    """Run ``command`` in the checkout; return whether it succeeded, its seconds and the
    last lines of its output."""
    started = time.monotonic()
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
    return done.returncode == 0, time.monotonic() - started, tail


def nccl_rounds() -> dict[str, float]:
    """NCCL in a world of one, timed: init and first collective, abort, again."""
    import torch.distributed as dist  # noqa: PLC0415

    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
    figures: dict[str, float] = {}
    for attempt in (1, 2):
        started = time.monotonic()
        prefixed = dist.PrefixStore(f"round-{attempt}", store)
        device = torch.device("cuda", 0)
        dist.init_process_group("nccl", store=prefixed, rank=0, world_size=1, device_id=device)
        figures[f"init {attempt}"] = time.monotonic() - started
        started = time.monotonic()
        value = torch.ones(1, device=device)
        dist.all_reduce(value)
        torch.cuda.synchronize()
        figures[f"first collective {attempt}"] = time.monotonic() - started
        started = time.monotonic()
        dist.distributed_c10d._abort_process_group()  # as a broken round does
        figures[f"abort {attempt}"] = time.monotonic() - started
    return figures


def snapshot_bandwidth() -> dict[str, float]:
    """A commit's snapshot of a model on the GPU, against a plain copy of the same bytes."""
    import torch.distributed as dist  # noqa: PLC0415
    from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415
    from torch.distributed.fsdp import fully_shard  # noqa: PLC0415

    from elasticjob.worker_runtime.elastic.sharded.shard_snapshot import (  # noqa: PLC0415
        take_snapshot,
    )

    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
    device = torch.device("cuda", 0)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=device)
    try:
        mesh = init_device_mesh("cuda", (1,))
        model = torch.nn.Sequential(*(torch.nn.Linear(4096, 4096) for _ in range(8))).to(device)
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters())
        model(torch.randn(8, 4096, device=device)).sum().backward()
        optimizer.step()
        torch.cuda.synchronize()
        started = time.monotonic()
        snapshot = take_snapshot(model, optimizer, 1, 0)
        snapshot_s = time.monotonic() - started
        nbytes = snapshot.nbytes()
        plain = [torch.empty(nbytes // 4, device=device)]
        torch.cuda.synchronize()
        started = time.monotonic()
        plain[0].to("cpu")
        plain_s = time.monotonic() - started
    finally:
        dist.destroy_process_group()
    return {
        "bytes": float(nbytes),
        "snapshot GB/s": nbytes / snapshot_s / 1e9,
        "plain copy GB/s": nbytes / plain_s / 1e9,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-write", action="store_true", help=f"do not write {DOC.name}")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(f"gpu-check: skipped, no CUDA device here (torch {torch.__version__})")
        return 0
    lines = [
        f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}, CUDA "
        f"{torch.version.cuda}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}; "
        f"{datetime.date.today().isoformat()}",
        "",
    ]
    ok, seconds, tail = run(
        [sys.executable, "-m", "pytest", "-q", "tests/integration/test_gpu_job.py"]
    )
    lines.append(f"- CUDA-only tests: {'passed' if ok else 'FAILED'} in {seconds:.0f} s")
    failed = not ok
    if not ok:
        print(tail)
    for name, seconds in nccl_rounds().items():
        lines.append(f"- NCCL, world of one, {name}: {seconds * 1000:.1f} ms")
    for flags in ([], ["--hsdp"]):
        command = [sys.executable, "-m", "elasticjob.launcher.run_command", "-np", "1",
                   "-H", "127.0.1.1:1", "--backend", "nccl", sys.executable,
                   "examples/sharded_lm/train.py", "--epochs", "1", "--samples", "256",
                   *flags]  # fmt: skip
        ok, seconds, tail = run(command)
        kind = "HSDP" if flags else "one-dimensional"
        lines.append(f"- sharded example on CUDA, {kind}: "
                     f"{'ran' if ok else 'FAILED'} in {seconds:.0f} s")  # fmt: skip
        failed |= not ok
        if not ok:
            print(tail)
    figures = snapshot_bandwidth()
    lines.append(
        f"- snapshot to host memory of {figures['bytes'] / 1e9:.2f} GB: "
        f"{figures['snapshot GB/s']:.1f} GB/s, a plain copy {figures['plain copy GB/s']:.1f} GB/s"
    )
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        DOC.write_text(
            "# On a GPU\n\nWhat `make gpu-check` (`bench/gpu_check.py`) measured on one GPU.\n\n"
            + text
            + "\n"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
