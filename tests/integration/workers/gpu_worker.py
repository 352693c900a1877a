"""Worker script of the GPU job test: trains a few committed steps on its slot's GPU under
NCCL, as a horovodrun script does (``torch.cuda.set_device(hvd.local_rank())``), and writes
what it saw to ``<out>/rank-<rank>.json``."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

import elasticjob.worker_runtime as hvd
from elasticjob.library_env import (
    ENV_CUDA_VISIBLE_DEVICES,
    ENV_GLOO_SOCKET_IFNAME,
    ENV_NCCL_SOCKET_IFNAME,
)
from elasticjob.worker_contract import ENV_TORCH_LOCAL_RANK

STEPS = 3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    hvd.init()
    torch.cuda.set_device(hvd.local_rank())  # a Horovod script's line: the runtime's device
    model = torch.nn.Linear(8, 1).cuda()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, step=0)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.step < STEPS:
            optimizer.zero_grad()
            model(torch.ones(4, 8, device="cuda")).sum().backward()
            optimizer.step()
            state.step += 1
            state.commit()

    train(state)
    summed = hvd.allreduce(torch.ones(3, device="cuda"), op=hvd.Sum)
    seen = {
        "device": str(hvd.device()),
        "current_device": torch.cuda.current_device(),
        "allreduce_device": str(summed.device),
        "allreduce": summed.tolist(),
        "size": hvd.size(),
        "steps": state.step,
        "nccl_built": hvd.nccl_built(),
        "env": {
            name: os.environ.get(name)
            for name in (
                ENV_TORCH_LOCAL_RANK,
                ENV_GLOO_SOCKET_IFNAME,
                ENV_NCCL_SOCKET_IFNAME,
                ENV_CUDA_VISIBLE_DEVICES,
            )
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank-{hvd.rank()}.json").write_text(json.dumps(seen))


if __name__ == "__main__":
    main()
