"""Elastic DistributedDataParallel on scikit-learn's bundled digits with a fixed global batch:
every optimizer step averages the gradients of the same number of samples, whatever the
number of workers, so the learning rate tuned for it stays right through every resize.

What differs from ``train.py`` (see "A fixed global batch" in docs/worker-runtime.md):

- ``hvd.elastic.GlobalBatchSampler(dataset, global_batch=G, micro_batch=B)`` is the loader's
  ``batch_sampler``: it deals each epoch in global batches of ``G`` samples, split over the
  workers of the round in micro-batches of at most ``B`` (the most a worker's memory holds);
- each micro-batch's mean loss is multiplied by ``micro.loss_scale`` and its backward pass
  runs under ``hvd.elastic.accumulate(micro, model)`` (``no_sync`` until the last
  micro-batch of the global batch); the optimizer steps once per global batch, and
  ``record_step()`` counts it;
- the learning rate is fixed (no rescaling with the world size).

Run it under the local launcher, e.g.

    elasticjob-run -np 2 --min-np 1 --max-np 4 \\
        --host-discovery-script examples/digits/discover_hosts.sh \\
        python examples/ddp_digits/train_global_batch.py --epochs 8
"""

from __future__ import annotations

import argparse
import logging
import os

import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

import elasticjob.worker_runtime as hvd


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--global-batch", type=int, default=128, help="samples per step")
    parser.add_argument("--micro-batch", type=int, default=32, help="most per forward pass")
    parser.add_argument("--lr", type=float, default=0.08, help="tuned for the global batch")
    parser.add_argument("--steps-per-commit", type=int, default=2)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    hvd.init()
    device = hvd.device()
    local_rank = int(os.environ["LOCAL_RANK"])

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
    optimizer = torch.optim.SGD(module.parameters(), lr=args.lr, momentum=0.9)
    batches = hvd.elastic.GlobalBatchSampler(
        dataset, global_batch=args.global_batch, micro_batch=args.micro_batch, seed=42
    )
    loader = DataLoader(dataset, batch_sampler=batches)
    state = hvd.elastic.TorchState(
        model=model,
        optimizer=optimizer,
        batches=batches,
        epoch=0,
        steps=0,
        seen=torch.zeros(len(dataset), dtype=torch.int64),
    )

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.epoch < args.epochs:
            counts = torch.zeros(len(dataset), dtype=torch.int64)
            for i, (x, y, idx) in enumerate(loader):
                micro = batches.micro_batch(i)
                with hvd.elastic.accumulate(micro, model):
                    loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
                    (loss * micro.loss_scale).backward()
                counts += torch.bincount(idx[: micro.size], minlength=len(dataset))
                if not micro.last:
                    continue
                optimizer.step()
                optimizer.zero_grad()
                batches.record_step()
                state.seen += hvd.allreduce(counts, op=hvd.Sum)
                counts.zero_()
                state.steps += 1
                if state.steps % args.steps_per_commit == 0:
                    state.commit()
            report_epoch(state, features.to(device), labels.to(device))
            state.epoch += 1
            state.seen.zero_()
            batches.set_epoch(state.epoch)
            state.commit()

    train(state)
    hvd.shutdown()


def report_epoch(
    state: hvd.elastic.TorchState, features: torch.Tensor, labels: torch.Tensor
) -> None:
    with torch.no_grad():
        accuracy = (state.model.module(features).argmax(dim=1) == labels).float().mean().item()
    once = bool((state.seen == 1).all())
    if hvd.rank() == 0:
        print(
            f"epoch {state.epoch}: accuracy {accuracy:.3f}, {hvd.size()} workers, "
            f"{state.steps} steps, round {hvd.current_round()}, "
            f"each sample trained once: {once}",
            flush=True,
        )


if __name__ == "__main__":
    main()
