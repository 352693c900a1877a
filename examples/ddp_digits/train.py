"""Elastic DistributedDataParallel on scikit-learn's bundled digits, written like a torchrun
script (no download).

What differs from the torchrun version (see "torchrun / DDP recipe" in
docs/worker-runtime.md):

- ``hvd.init()`` instead of ``dist.init_process_group("env://")``; ``LOCAL_RANK``, ``RANK``
  and ``WORLD_SIZE`` are still in the environment, but the last two change with each round,
  so they are read inside the training function;
- ``hvd.elastic.DistributedDataParallel(model)`` instead of ``DistributedDataParallel``: it
  is rebuilt on every round's group by itself;
- ``hvd.elastic.ElasticSampler(dataset, batch_size=B)`` instead of ``DistributedSampler``:
  every sample once per epoch, across failures and resizes, with no duplicate padding;
- the loop lives in a function wrapped by ``hvd.elastic.run`` and commits its
  ``TorchState`` every few steps.

Run it under the local launcher, e.g.

    elasticjob-run -np 2 --min-np 1 --max-np 4 \\
        --host-discovery-script examples/digits/discover_hosts.sh \\
        python examples/ddp_digits/train.py --epochs 8
"""

from __future__ import annotations

import argparse
import logging
import os
import time

import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

import elasticjob.worker_runtime as hvd
from elasticjob.worker_runtime.training import step_weight


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--base-lr", type=float, default=0.02, help="learning rate per worker")
    parser.add_argument("--batches-per-commit", type=int, default=5)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    hvd.init()  # torchrun: dist.init_process_group("env://")
    local_rank = int(os.environ["LOCAL_RANK"])  # a worker's local rank never changes
    device = hvd.device()  # cuda:LOCAL_RANK under NCCL, else the CPU

    digits = load_digits()
    features = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.int64)
    dataset = TensorDataset(features, labels, torch.arange(len(labels)))

    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
    ).to(device)
    device_ids = [local_rank] if device.type == "cuda" else None
    model = hvd.elastic.DistributedDataParallel(module, device_ids=device_ids)
    optimizer = torch.optim.SGD(module.parameters(), lr=args.base_lr, momentum=0.9)
    sampler = hvd.elastic.ElasticSampler(dataset, seed=42, batch_size=args.batch_size)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    state = hvd.elastic.TorchState(
        model=model,
        optimizer=optimizer,
        sampler=sampler,
        epoch=0,
        seen=torch.zeros(len(dataset), dtype=torch.int64),
    )

    def scale_lr() -> None:
        for group in optimizer.param_groups:
            group["lr"] = args.base_lr * int(os.environ["WORLD_SIZE"])

    state.register_reset_callbacks([scale_lr])

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        scale_lr()
        while state.epoch < args.epochs:
            started = time.monotonic()
            for batch_idx, (x, y, idx) in enumerate(loader):
                # 0 only for the one padding sample a rank may get in an epoch's last step.
                trained = step_weight.pass_weight() > 0
                optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
                loss.backward()
                optimizer.step()
                counts = torch.bincount(idx, minlength=len(dataset)) * trained
                state.seen += hvd.allreduce(counts, op=hvd.Sum)
                state.sampler.record_batch(batch_idx, args.batch_size)
                if (batch_idx + 1) % args.batches_per_commit == 0:
                    state.commit()
            report_epoch(state, features.to(device), labels.to(device), started)
            state.epoch += 1
            state.seen.zero_()
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    hvd.shutdown()


def report_epoch(
    state: hvd.elastic.TorchState, features: torch.Tensor, labels: torch.Tensor, started: float
) -> None:
    with torch.no_grad():
        accuracy = (state.model.module(features).argmax(dim=1) == labels).float().mean().item()
    once = bool((state.seen == 1).all())
    if int(os.environ["RANK"]) == 0:
        print(
            f"epoch {state.epoch}: accuracy {accuracy:.3f}, {os.environ['WORLD_SIZE']} workers, "
            f"round {hvd.current_round()}, each sample trained once: {once}",
            flush=True,
        )
    seconds = max(time.monotonic() - started, 1e-9)
    hvd.report_progress(state.epoch, 0, len(labels) / seconds)


if __name__ == "__main__":
    main()
