"""A PyTorch Lightning script, as people write them for torchrun: ``Trainer(strategy="ddp")``
finds torchrun's variables by itself, ``ModelCheckpoint`` saves after every step, and a start
resumes from the last checkpoint (``ckpt_path="last"``). ``num_nodes`` follows the job's hosts
(``GROUP_WORLD_SIZE``), which Lightning checks against ``WORLD_SIZE``. It never imports
elasticjob.

For the tests a callback appends what it saw to ``<log-dir>/<pid>.jsonl`` (its variables at
each start, each step, its weights at the end) and the epoch it reached for a discovery
script, and fails on purpose where ``--fail-at`` says.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset


class Regression(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch: list[torch.Tensor], _index: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


CHECKPOINTED_WITHIN_S = 30.0
"""How long a kill waits for rank 0's checkpoint of the step before it."""


class Events(Callback):
    """Writes the test's events; kills this process or waits for a larger world on cue."""

    def __init__(self, args: argparse.Namespace) -> None:
        self._args = args
        args.log_dir.mkdir(parents=True, exist_ok=True)
        self._path = args.log_dir / f"{os.getpid()}.jsonl"
        self._restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))

    def record(self, event: str, trainer: L.Trainer, **fields: Any) -> None:
        record = {"ev": event, "time": time.time(), "pid": os.getpid()}
        record |= {"rank": trainer.global_rank, "size": trainer.world_size, **fields}
        record["host"] = os.environ.get("HOROVOD_HOSTNAME")  # its pod under the operator
        with self._path.open("a") as out:
            out.write(json.dumps(record) + "\n")

    def on_train_start(self, trainer: L.Trainer, _module: L.LightningModule) -> None:
        names = (
            *("RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_WORLD_SIZE", "TORCHELASTIC_RUN_ID"),
            "TORCHELASTIC_RESTART_COUNT",
        )
        env = {name: os.environ.get(name) for name in names}
        self.record("start", trainer, step=trainer.global_step, env=env)

    def on_train_epoch_start(self, trainer: L.Trainer, _module: L.LightningModule) -> None:
        if trainer.global_rank == 0 and self._args.epoch_file is not None:
            self._args.epoch_file.write_text(str(trainer.current_epoch))

    def on_train_batch_start(
        self, trainer: L.Trainer, _module: L.LightningModule, _batch: Any, _index: int
    ) -> None:
        step, rank = trainer.global_step, trainer.global_rank
        if self._args.fail_at == f"{step}:{rank}" and self._restarts == 0:
            self._checkpointed(step)  # the kill comes after the step before it was saved
            self.record("kill", trainer, step=step)
            os.kill(os.getpid(), signal.SIGKILL)
        if self._args.await_size is not None:
            at_step, size = (int(part) for part in self._args.await_size.split(":"))
            if step == at_step and trainer.world_size < size:
                time.sleep(60)  # the agent stops the script once the larger round is formed
                sys.exit(4)

    def _checkpointed(self, step: int) -> None:
        """Wait (bounded) until rank 0's last checkpoint is of ``step``."""
        deadline = time.monotonic() + CHECKPOINTED_WITHIN_S
        while step > 0 and time.monotonic() < deadline:
            try:
                last = torch.load(self._args.checkpoint / "last.ckpt", weights_only=False)
                if last["global_step"] == step:
                    return
            except (OSError, RuntimeError, KeyError, EOFError):
                pass  # not written yet
            time.sleep(0.01)

    def on_train_batch_end(
        self, trainer: L.Trainer, _module: L.LightningModule, *_args: Any
    ) -> None:
        time.sleep(self._args.step_s)
        self.record("step", trainer, step=trainer.global_step)

    def on_train_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        weights = b"".join(p.detach().numpy().tobytes() for p in module.parameters())
        self.record("done", trainer, digest=hashlib.sha256(weights).hexdigest())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path, required=True, help="checkpoint folder")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--step-s", type=float, default=0.0)
    parser.add_argument("--fail-at", metavar="STEP:RANK", help="SIGKILL there, first start only")
    parser.add_argument("--await-size", metavar="STEP:SIZE")
    parser.add_argument("--epoch-file", type=Path, help="rank 0 writes its epoch there")
    args = parser.parse_args()
    inputs = torch.arange(64 * 4, dtype=torch.float32).reshape(64, 4) / 256
    data = DataLoader(TensorDataset(inputs, inputs.sum(dim=1, keepdim=True)), batch_size=8)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        num_nodes=int(os.environ["GROUP_WORLD_SIZE"]),
        strategy="ddp",
        max_epochs=args.epochs,
        callbacks=[
            ModelCheckpoint(dirpath=args.checkpoint, save_last=True, every_n_train_steps=1),
            Events(args),
        ],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    resume = "last" if (args.checkpoint / "last.ckpt").exists() else None
    trainer.fit(Regression(), data, ckpt_path=resume)


if __name__ == "__main__":
    main()
