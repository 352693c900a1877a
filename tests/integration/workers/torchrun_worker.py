"""A torchrun-style DDP script, unchanged for the launcher: it reads ``LOCAL_RANK``, sets its
own group up from the environment (``env://``) and trains a step with plain
``DistributedDataParallel``; it never imports the worker runtime."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("gloo")
    model = DistributedDataParallel(torch.nn.Linear(4, 2))
    model(torch.randn(8, 4)).sum().backward()
    print(f"rank {dist.get_rank()} of {dist.get_world_size()}, local rank {local_rank}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
