"""A user's own elastic training script, not one of the project's examples: a linear
regression written against the elastic API, with a helper module beside it. The end-to-end
tests submit this folder as a new user would (``elasticjob submit``)."""

from __future__ import annotations

import argparse
import time

import torch
from synthetic import regression_data
from torch.utils.data import DataLoader, TensorDataset

import elasticjob.worker_runtime as hvd


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--pace", type=float, default=0.0, help="seconds per step, to watch")
    args = parser.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    x, y = regression_data(256)
    dataset = TensorDataset(x, y)
    model = torch.nn.Linear(x.shape[1], 1)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=1)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)
    state = hvd.elastic.TorchState(model=model, optimizer=optimizer, sampler=sampler, epoch=0)

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.epoch < args.epochs:
            for batch_idx, (features, target) in enumerate(loader):
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(features), target).backward()
                optimizer.step()
                state.sampler.record_batch(batch_idx, 16)
                time.sleep(args.pace)
                if batch_idx % 4 == 3:
                    state.commit()
            with torch.no_grad():
                loss = torch.nn.functional.mse_loss(model(x), y).item()
            if hvd.rank() == 0:
                print(f"epoch {state.epoch}: loss {loss:.4f} on {hvd.size()} workers", flush=True)
            hvd.report_progress(state.epoch, 0, 0.0)
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    if hvd.rank() == 0:
        print("training done", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
