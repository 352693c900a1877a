"""What matching collectives by name costs (prints its figures; asserts nothing).

Worker processes over Gloo on the loopback (one host, one torch thread each) time blocking
allreduces of several sizes in rotating blocks: ``unnamed`` and ``named`` (one name every
time, so its calls are agreed on from a count alone), Horovod's API as scripts call it
(negotiated: every rank's call agreed on through the round's store before the data moves),
and ``order``, the same reduction issued straight on the round's group (the baseline: how
collectives were matched before, and how the runtime's internal ones still are).

Figures, per size: the median over repeats of each variant's mean time per call, and for the
negotiated ones their cost per call (the median of the per-repeat differences from
``order``) and the ratio to ``order``.

Usage: nice -n 5 python bench/negotiation.py [--workers 2] [--repeats 20] [--calls 50]
[--sizes 16 65536 4194304]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from optimizer import run_job  # beside this script (run by path)

WORKER = Path(__file__).resolve().parent / "negotiation_worker.py"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 65536, 4194304])
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as scratch:
        blocks = run_job(
            Path(scratch),
            args.workers,
            ["--repeats", str(args.repeats), "--calls", str(args.calls),
             "--sizes", *map(str, args.sizes)],
            WORKER,
        )  # fmt: skip
    print(f"load average after: {os.getloadavg()[0]:.2f} (1 min); {args.workers} workers")
    for size in args.sizes:
        by_repeat: dict[int, dict[str, float]] = {}
        for block in blocks:
            if block["size"] == size:
                by_repeat.setdefault(int(block["repeat"]), {})[str(block["variant"])] = float(
                    block["call_s"]
                )
        repeats = list(by_repeat.values())
        order = statistics.median(r["order"] for r in repeats)
        figures = [f"{size * 4} bytes: by order {order * 1e3:.3f} ms per call"]
        for variant in ("unnamed", "named"):
            mine = statistics.median(r[variant] for r in repeats)
            cost = statistics.median(r[variant] - r["order"] for r in repeats)
            ratio = statistics.median(r[variant] / r["order"] for r in repeats)
            figures.append(
                f"{variant} {mine * 1e3:.3f} ms (negotiation {cost * 1e3:+.3f} ms, x{ratio:.2f})"
            )
        print("; ".join(figures))


if __name__ == "__main__":
    main()
