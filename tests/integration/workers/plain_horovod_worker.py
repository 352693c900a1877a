"""A non-elastic Horovod-style script (no ``elastic.run``): ``init()``, broadcast the
parameters, a few ``DistributedOptimizer`` steps, an averaged metric, then the end of the
script. ``--teardown-s S`` makes the interpreter's teardown last S seconds more (an object
whose finalizer sleeps when the module's globals are cleared), as torch's own teardown does
on a loaded machine: the heartbeat thread is stopped by then."""

from __future__ import annotations

import argparse
import time

import torch

import elasticjob.worker_runtime as hvd


class SlowTeardown:
    """Sleeps in its finalizer, which runs while the interpreter tears the module down."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __del__(self) -> None:
        time.sleep(self.seconds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--teardown-s", type=float, default=0.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    model = torch.nn.Linear(4, 2)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randn(8, 4)).sum().backward()
        optimizer.step()
    loss = hvd.allreduce(torch.tensor(1.0), name="avg_loss")
    print(f"rank {hvd.rank()} of {hvd.size()}: trained, average {loss.item():.1f}", flush=True)
    global teardown  # a module global: finalized at interpreter teardown
    teardown = SlowTeardown(args.teardown_s)


teardown: SlowTeardown | None = None

if __name__ == "__main__":
    main()
