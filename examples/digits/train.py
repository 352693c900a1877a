"""Elastic training of a small MLP on scikit-learn's bundled digits (no download).

Written against Horovod's elastic API, with the import line changed:

    import elasticjob.worker_runtime as hvd

and three optional calls Horovod does not have: ``hvd.report_progress`` (the job's status
shows the progress), ``hvd.current_round()`` (printed) and the sampler's ``num_real_samples``
(the exactly-once check leaves the padding out).

Run it under the local launcher (see docs/launcher.md), e.g.

    elasticjob-run -np 2 --min-np 1 --max-np 4 \\
        --host-discovery-script examples/digits/discover_hosts.sh \\
        python examples/digits/train.py --epochs 8
"""

from __future__ import annotations

import argparse
import logging
import time

import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

import elasticjob.worker_runtime as hvd


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--base-lr", type=float, default=0.02, help="learning rate per worker")
    parser.add_argument("--batches-per-commit", type=int, default=5)
    parser.add_argument("--pace", type=float, default=0.0, help="extra seconds per step, to watch")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    hvd.init()

    digits = load_digits()
    features = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.int64)
    dataset = TensorDataset(features, labels, torch.arange(len(labels)))

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.base_lr * hvd.size(), momentum=0.9)
    )
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=42)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    state = hvd.elastic.TorchState(
        model=model,
        optimizer=optimizer,
        sampler=sampler,
        epoch=0,
        batch=0,
        seen=torch.zeros(len(dataset), dtype=torch.int64),
    )

    def on_reset() -> None:
        # The world changed size: scale the learning rate with it (the sampler repartitions
        # what is left of the epoch by itself).
        for group in optimizer.param_groups:
            group["lr"] = args.base_lr * hvd.size()

    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.epoch < args.epochs:
            started = time.monotonic()
            real = state.sampler.num_real_samples
            for batch_idx, (x, y, idx) in enumerate(loader):
                first = batch_idx * args.batch_size
                keep = torch.arange(first, first + len(idx)) < real  # padding is not trained
                optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x[keep]), y[keep])
                loss.backward()
                optimizer.step()
                state.seen += hvd.allreduce(
                    torch.bincount(idx[keep], minlength=len(dataset)), op=hvd.Sum
                )
                state.sampler.record_batch(batch_idx, args.batch_size)
                state.batch += 1
                if args.pace:
                    time.sleep(args.pace)
                if state.batch % args.batches_per_commit == 0:
                    state.commit()
            report_epoch(state, features, labels, time.monotonic() - started)
            state.epoch += 1
            state.batch = 0
            state.seen.zero_()
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    hvd.shutdown()


def report_epoch(
    state: hvd.elastic.TorchState, features: torch.Tensor, labels: torch.Tensor, seconds: float
) -> None:
    with torch.no_grad():
        accuracy = (state.model(features).argmax(dim=1) == labels).float().mean().item()
    once = bool((state.seen == 1).all())
    if hvd.rank() == 0:
        print(
            f"epoch {state.epoch}: accuracy {accuracy:.3f}, {hvd.size()} workers, "
            f"round {hvd.current_round()}, every sample trained exactly once: {once}"
        )
    hvd.report_progress(state.epoch, state.batch, len(labels) / max(seconds, 1e-9))


if __name__ == "__main__":
    main()
