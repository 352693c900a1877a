"""A torchrun DDP script on scikit-learn's bundled digits (no download), written as people
write them for torchrun: the group from the environment, ``DistributedDataParallel``,
``DistributedSampler``, and a checkpoint of its own that rank 0 saves after every epoch and
every rank resumes from when started again. It never imports elasticjob, and runs unchanged
under any of:

    torchrun --nproc-per-node 2 examples/torchrun_digits/train.py
    elasticjob-run --mode restart -np 2 python examples/torchrun_digits/train.py
    kubectl apply -f examples/elasticjob-restart.yaml      # spec.mode: restart

Under the last two a failure, a scale-out or a scale-in stops every process of the job and
starts it again with its new rank, in its own pod; the script resumes from its checkpoint
(which must be where every rank can read it: the pods' shared volume).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint", type=Path, default=Path("checkpoint.pt"))
    parser.add_argument("--pace", type=float, default=0.0, help="seconds to sleep per batch")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()

    digits = load_digits()
    features = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.int64)
    dataset = TensorDataset(features, labels)

    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
    ).to(device)
    optimizer = torch.optim.SGD(module.parameters(), lr=args.lr, momentum=0.9)
    start_epoch = 0
    if args.checkpoint.exists():
        saved = torch.load(args.checkpoint, map_location=device)
        module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        start_epoch = saved["epoch"]
    model = DistributedDataParallel(
        module, device_ids=[local_rank] if device.type == "cuda" else None
    )
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    if rank == 0:
        print(f"{world_size} workers, from epoch {start_epoch}", flush=True)

    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
            time.sleep(args.pace)
        if rank == 0:
            with torch.no_grad():
                predicted = module(features.to(device)).argmax(dim=1)
            accuracy = (predicted == labels.to(device)).float().mean().item()
            print(f"epoch {epoch}: accuracy {accuracy:.3f}, {world_size} workers", flush=True)
            saved = {"model": module.state_dict(), "optimizer": optimizer.state_dict()}
            partial = args.checkpoint.with_suffix(".partial")
            torch.save({**saved, "epoch": epoch + 1}, partial)
            partial.replace(args.checkpoint)  # atomic: a start never reads half a file
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
