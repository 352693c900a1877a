"""The digits of ``train.py`` as a PyTorch Lightning script, written as people write them for
torchrun: ``Trainer(strategy="ddp")`` reads torchrun's variables by itself, ``ModelCheckpoint``
keeps ``last.ckpt`` and a start resumes from it (``ckpt_path="last"``). It never imports
elasticjob, and runs unchanged under any of:

    torchrun --nproc-per-node 2 examples/torchrun_digits/train_lightning.py
    elasticjob-run --mode restart -np 2 python examples/torchrun_digits/train_lightning.py
    kubectl apply -f examples/elasticjob-restart.yaml   # with this script as the command

``num_nodes`` follows the job's hosts (``GROUP_WORLD_SIZE``, which restart mode sets anew at
each start), since Lightning checks ``num_nodes * devices`` against ``WORLD_SIZE``. The
checkpoint folder must be where every rank can read it (the pods' shared volume).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset


class DigitsClassifier(L.LightningModule):
    """The two-layer classifier of ``train.py``."""

    def __init__(self, lr: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lr = lr
        self.net = torch.nn.Sequential(
            torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)
        )

    def training_step(self, batch: list[torch.Tensor], _index: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint", type=Path, default=Path("checkpoints"), help="folder")
    args = parser.parse_args()
    torch.set_num_threads(1)

    digits = load_digits()
    features = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.int64)
    loader = DataLoader(TensorDataset(features, labels), batch_size=args.batch_size)
    trainer = L.Trainer(
        accelerator="auto",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=int(os.environ.get("GROUP_WORLD_SIZE", "1")),
        strategy="ddp",
        max_epochs=args.epochs,
        callbacks=[ModelCheckpoint(dirpath=args.checkpoint, save_last=True)],
        logger=False,
        enable_model_summary=False,
    )
    resume = "last" if (args.checkpoint / "last.ckpt").exists() else None
    trainer.fit(DigitsClassifier(args.lr), loader, ckpt_path=resume)


if __name__ == "__main__":
    main()
