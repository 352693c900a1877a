"""Training script of ``convergence.py``: the digits MLP (elastic DDP, SGD with momentum) or
the sharded language model of ``examples/sharded_lm`` (FSDP2, AdamW), under the launcher, in
one of two batch modes:

- ``worker``: each worker trains ``--batch`` samples a step (``ElasticSampler``), so the
  global batch follows the world; the digits learning rate is scaled with the world size (as
  Horovod recommends), the language model's is not (as its example);
- ``global``: a fixed global batch of ``4 x --batch`` samples (``GlobalBatchSampler``,
  micro-batches of at most ``--batch``), the learning rate of four workers.

Rank 0 writes one line per step (``events-<pid>.jsonl``: round, world size, samples of the
epochs trained so far, the step's mean loss over every worker) and, at the end, the final
model's loss (and accuracy) on the evaluation data. With ``--kills SAMPLES:RANK,...`` that
rank SIGKILLs itself once when training passes that many samples (in the middle of a global
batch's accumulation); rank 0 writes the samples trained so far to ``--epoch-file`` for a host
discovery that resizes the job by them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.data import DataLoader, TensorDataset

import elasticjob.worker_runtime as hvd
from elasticjob.worker_runtime.training import step_weight

ROOT = Path(__file__).resolve().parents[1]
FULL_WORLD = 4
DIGITS_LR = 0.02
"""Per worker, scaled with the world size (``worker`` mode) or by four (``global``)."""
LM_SAMPLES = 1024
"""Training sequences of the language model."""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--workload", choices=("digits", "lm"), required=True)
    parser.add_argument("--mode", choices=("worker", "global"), required=True)
    parser.add_argument("--batch", type=int, required=True, help="per worker, or micro-batch")
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0, help="initialization and data order")
    parser.add_argument("--commit-every", type=int, default=5)
    parser.add_argument("--kills", default="", help="SAMPLES:RANK,...")
    parser.add_argument("--pace", type=float, default=0.0, help="extra seconds per step")
    parser.add_argument("--epoch-file", type=Path, help="rank 0 writes the samples trained")
    return parser.parse_args()


def load_lm_example() -> Any:
    """``examples/sharded_lm/train.py`` as a module (its model and data)."""
    spec = importlib.util.spec_from_file_location(
        "sharded_lm_example", ROOT / "examples" / "sharded_lm" / "train.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Digits:
    """An MLP on scikit-learn's digits under the elastic DDP."""

    def __init__(self, args: argparse.Namespace) -> None:
        from sklearn.datasets import load_digits  # noqa: PLC0415 (only this workload)

        digits = load_digits()
        self.features = torch.tensor(digits.data, dtype=torch.float32) / 16.0
        self.labels = torch.tensor(digits.target, dtype=torch.int64)
        self.dataset = TensorDataset(self.features, self.labels)
        torch.manual_seed(args.seed)
        self.module = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
        self.model = hvd.elastic.DistributedDataParallel(self.module)
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=DIGITS_LR, momentum=0.9)
        self.global_mode = args.mode == "global"

    def state(self, **extras: Any) -> Any:
        def scale_lr() -> None:
            workers = FULL_WORLD if self.global_mode else hvd.size()
            for group in self.optimizer.param_groups:
                group["lr"] = DIGITS_LR * workers

        state = hvd.elastic.TorchState(model=self.model, optimizer=self.optimizer, **extras)
        state.register_reset_callbacks([scale_lr])
        scale_lr()
        return state

    def live(self, state: Any) -> tuple[Any, torch.optim.Optimizer]:
        return self.model, self.optimizer

    def losses(self, model: Any, batch: list[torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(model(x), y, reduction="none")

    def evaluate(self, state: Any) -> dict[str, float]:
        with torch.no_grad():
            logits = self.module(self.features)
            loss = nn.functional.cross_entropy(logits, self.labels).item()
            accuracy = (logits.argmax(dim=1) == self.labels).float().mean().item()
        return {"loss": loss, "accuracy": accuracy}


class LanguageModel:
    """The sharded LM example's model and Markov-chain data under a ``ShardedState``."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.example = load_lm_example()
        self.args = self.example.parse_args(["--samples", str(LM_SAMPLES + 128), "--layers", "2"])
        # The data (seed 0: the same chain and sequences in every run), the last 128
        # sequences held out for the evaluation.
        sequences = self.example.markov_dataset(self.args).tensors[0]
        self.dataset = TensorDataset(sequences[:LM_SAMPLES])
        self.held_out = sequences[LM_SAMPLES:]
        self.init_seed = args.seed

    def state(self, **extras: Any) -> Any:
        example, args = self.example, self.args

        def build(mesh: DeviceMesh) -> tuple[nn.Module, torch.optim.Optimizer]:
            with torch.device("meta"):
                model = example.LanguageModel(args)
            for block in model.blocks:
                fully_shard(block, mesh=mesh, mp_policy=MixedPrecisionPolicy())
            fully_shard(model, mesh=mesh, mp_policy=MixedPrecisionPolicy())
            model.to_empty(device=hvd.device())
            if not state.restoring:
                example.init_weights(model, self.init_seed)
            optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
            return model, optimizer

        # Two copies of every shard: a scale-in from 4 to 2 takes two adjacent ranks away
        # at once, with one copy both holders of a shard may go (the leavers do not hand
        # their shards over; see docs/sharded.md).
        state = hvd.elastic.ShardedState(build, redundancy=2, **extras)
        return state

    def live(self, state: Any) -> tuple[Any, torch.optim.Optimizer]:
        return state.model, state.optimizer

    def losses(self, model: Any, batch: list[torch.Tensor]) -> torch.Tensor:
        (sequences,) = batch
        logits = model(sequences[:, :-1])
        flat = nn.functional.cross_entropy(
            logits.flatten(0, 1).float(), sequences[:, 1:].flatten(), reduction="none"
        )
        return flat.view(len(sequences), -1).mean(dim=1)

    def evaluate(self, state: Any) -> dict[str, float]:
        with torch.no_grad():
            return {"loss": self.losses(state.model, [self.held_out]).mean().item()}


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    hvd.init()
    workload: Digits | LanguageModel = (
        Digits(args) if args.workload == "digits" else LanguageModel(args)
    )
    dataset = workload.dataset
    if args.mode == "global":
        sampler: Any = hvd.elastic.GlobalBatchSampler(
            dataset, FULL_WORLD * args.batch, args.batch, seed=args.seed
        )
        loader = DataLoader(dataset, batch_sampler=sampler)
    else:
        sampler = hvd.elastic.ElasticSampler(dataset, seed=args.seed, batch_size=args.batch)
        loader = DataLoader(dataset, batch_size=args.batch, sampler=sampler)
    state = workload.state(sampler=sampler, epoch=0, step=0)
    kills = [tuple(int(v) for v in kill.split(":")) for kill in args.kills.split(",") if kill]
    log = args.log_dir / f"events-{os.getpid()}.jsonl"

    def write(event: dict[str, Any]) -> None:
        with log.open("a") as out:
            out.write(json.dumps({**event, "time": time.time()}) + "\n")

    def trained_so_far() -> int:
        return state.epoch * len(dataset) + sampler.processed_num

    def maybe_die(done: int) -> None:
        for number, (samples, rank) in enumerate(kills):
            fired = args.log_dir / f"killed-{number}"
            if done >= samples and hvd.rank() == rank and not fired.exists():
                fired.touch()
                os.kill(os.getpid(), signal.SIGKILL)

    @hvd.elastic.run
    def train(state: Any) -> None:
        while state.epoch < args.epochs:
            model, optimizer = workload.live(state)
            loss_sum, count = 0.0, 0
            for i, batch in enumerate(loader):
                if args.mode == "global":
                    micro = sampler.micro_batch(i)
                    if micro.index == min(1, micro.count - 1):
                        maybe_die(trained_so_far())
                    with hvd.elastic.accumulate(micro, model):
                        losses = workload.losses(model, batch)
                        (losses.mean() * micro.loss_scale).backward()
                    loss_sum += losses[: micro.size].sum().item()
                    count += micro.size
                    if not micro.last:
                        continue
                else:
                    maybe_die(trained_so_far())
                    losses = workload.losses(model, batch)
                    real = step_weight.pass_weight() > 0
                    (losses.mean() * real).backward()
                    loss_sum, count = losses.sum().item() * real, len(losses) * real
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()
                if args.mode == "global":
                    sampler.record_step()
                else:
                    sampler.record_batch(i, args.batch)
                totals = hvd.allreduce(torch.tensor([loss_sum, float(count)]), op=hvd.Sum)
                loss_sum, count = 0.0, 0
                state.step += 1
                done = trained_so_far()
                if hvd.rank() == 0:
                    loss = totals[0].item() / max(totals[1].item(), 1.0)
                    write({"ev": "step", "round": hvd.current_round(), "size": hvd.size(),
                           "samples": done, "loss": loss})  # fmt: skip
                    if args.epoch_file is not None:
                        args.epoch_file.write_text(str(done))
                if state.step % args.commit_every == 0:
                    state.commit()
                if args.pace:
                    time.sleep(args.pace)  # to let a host discovery keep up with the steps
            state.epoch += 1
            sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    result = workload.evaluate(state)
    if hvd.rank() == 0:
        write({"ev": "end", **result})
    hvd.shutdown()


if __name__ == "__main__":
    main()
