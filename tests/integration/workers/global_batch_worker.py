"""Training script of the fixed-global-batch tests: the models of ``fidelity_worker.py`` (the
``torch`` family under ``DistributedOptimizer`` and the elastic DDP, the ``sharded`` one under
FSDP2) trained on a ``GlobalBatchSampler``: micro-batches accumulated with
``elastic.accumulate``, one optimizer step per global batch, whatever the world.

Learning-rate schedules and a loss scale are kept as the fidelity worker's ``--scheduler mixed
--grad-scaler`` keep them (one schedule per torch-family model, the DDP model with SGD stepping
through a ``GradScaler``; the sharded ``build`` returns a ``SequentialLR``), stepped once per
global batch. ``--fail STEP:RANK`` SIGKILLs a rank in the middle of that step's gradient
accumulation (before its second micro-batch, or its only one); ``--await-size`` and
``--epoch-file`` are the fidelity worker's. Every step event says which samples the rank
trained, the live learning rates and the loss scale; at the end rank 0 writes every model's
whole parameters and optimizer state to ``<log-dir>/end.pt``.
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path
from typing import Any

import torch
from fidelity_worker import (  # beside this script (run by path)
    SHARDED_MODELS,
    TORCH_MODELS,
    Events,
    build_sharded,
    data,
    make_optimizer,
    make_scheduler,
    mlp,
    schedule_of,
    split_pair,
    wait_for_world,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, TensorDataset

from elasticjob.worker_runtime.elastic.batch_plan import step_sizes

SEED = 5  # the test's reference follows the same order
SCALER = "ddp-sgd"
"""The model whose steps go through the ``GradScaler``."""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--family", choices=("torch", "sharded"), required=True)
    parser.add_argument("--global-batch", type=int, required=True)
    parser.add_argument("--micro-batch", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--commit-every", type=int, default=3)
    parser.add_argument("--fail", default="", help="STEP:RANK: SIGKILL that rank at that step")
    parser.add_argument("--epoch-file", type=Path, help="rank 0 writes its step here (discovery)")
    parser.add_argument("--await-size", default="", help="STEP:SIZE: wait for that world")
    return parser.parse_args()


def whole(tensor: torch.Tensor) -> torch.Tensor:
    value = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
    return value.detach().clone()


def dump_whole(path: Path | None, models: dict[str, Any], optimizers: dict[str, Any]) -> None:
    """Every model's whole parameters and optimizer state (gathered from the shards: every
    rank must call it), written by the rank given a ``path``."""
    out: dict[str, Any] = {}
    for name, model in models.items():
        params = dict(getattr(model, "module", model).named_parameters())
        state = optimizers[name].state
        out[name] = {
            "params": {n: whole(p) for n, p in params.items()},
            "optimizer": {
                f"{n}.{key}": whole(value) if isinstance(value, torch.Tensor) else value
                for n, p in params.items()
                for key, value in state.get(p, {}).items()
            },
        }
    if path is not None:
        torch.save(out, path)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    import elasticjob.worker_runtime as hvd  # noqa: PLC0415 (after the thread setting)

    hvd.init()
    features, targets = data()
    dataset = TensorDataset(features, targets, torch.arange(len(features)))
    batches = hvd.elastic.GlobalBatchSampler(
        dataset, args.global_batch, args.micro_batch, seed=SEED
    )
    loader = DataLoader(dataset, batch_sampler=batches)
    steps = args.epochs * len(step_sizes(len(dataset), args.global_batch))
    events = Events(args.log_dir, hvd.rank())
    fail_step, fail_rank = split_pair(args.fail, (-1, -1))
    await_step, await_size = split_pair(args.await_size, (-1, 0))
    fired = args.log_dir / "fired"
    reducers: dict[str, Any] = {}
    if args.family == "torch":
        models: dict[str, Any] = {}
        optimizers: dict[str, Any] = {}
        for i, name in enumerate(TORCH_MODELS):
            module = mlp(i)
            optimizer = make_optimizer(name.split("-")[1], module.parameters())
            if name.startswith("distopt"):
                models[name] = module
                optimizers[name] = reducers[name] = hvd.DistributedOptimizer(
                    optimizer, named_parameters=module.named_parameters()
                )
            else:
                models[name] = reducers[name] = hvd.elastic.DistributedDataParallel(module)
                optimizers[name] = optimizer
        kept = {f"model_{n}": m for n, m in models.items()}
        kept.update({f"optimizer_{n}": o for n, o in optimizers.items()})
        for name, optimizer in optimizers.items():
            schedule = make_scheduler(schedule_of(name, "mixed"), optimizer, steps)
            kept[f"scheduler_{name}"] = schedule
        kept["scaler"] = torch.amp.GradScaler("cpu", init_scale=4.0, growth_interval=2)
        state: Any = hvd.elastic.TorchState(step=0, epoch=0, batches=batches, **kept)
    else:

        def build(mesh: DeviceMesh) -> Any:
            return build_sharded(mesh, "adamw", "sequential", steps)

        state = hvd.elastic.ShardedState(build, step=0, epoch=0, batches=batches)

    def live() -> tuple[dict[str, Any], dict[str, Any], list[Any], list[Any]]:
        """Each model, its optimizer, what reduces the gradients, and the schedulers (a
        sharded state builds new ones every round)."""
        if args.family == "torch":
            schedulers = [getattr(state, f"scheduler_{n}") for n in TORCH_MODELS]
            return models, optimizers, list(reducers.values()), schedulers
        sharded = {name: state.model[name] for name in SHARDED_MODELS}
        optimizer = state.optimizer
        return (
            sharded,
            dict.fromkeys(SHARDED_MODELS, optimizer),
            list(sharded.values()),
            [state.scheduler],
        )

    @hvd.elastic.run
    def train(state: Any) -> None:
        while state.epoch < args.epochs:
            trained: list[int] = []
            for i, (x, y, indices) in enumerate(loader):
                micro = batches.micro_batch(i)
                if micro.index == min(1, micro.count - 1) and (state.step, hvd.rank()) == (
                    fail_step,
                    fail_rank,
                ) and not fired.exists():  # fmt: skip
                    fired.touch()
                    os.kill(os.getpid(), signal.SIGKILL)
                if micro.first and state.step == await_step:
                    wait_for_world(state, await_size)
                now_models, now_optimizers, now_reducers, schedulers = live()
                scaler = state.scaler if args.family == "torch" else None
                with hvd.elastic.accumulate(micro, *now_reducers):
                    for name, model in now_models.items():
                        loss = torch.nn.functional.mse_loss(model(x), y) * micro.loss_scale
                        (scaler.scale(loss) if name == SCALER and scaler else loss).backward()
                trained += indices[: micro.size].tolist()
                if not micro.last:
                    continue
                for name, optimizer in {id(o): (n, o) for n, o in now_optimizers.items()}.values():
                    if name == SCALER and scaler is not None:
                        scaler.step(optimizer)
                        scaler.update()
                    else:
                        optimizer.step()
                    optimizer.zero_grad()
                for scheduler in schedulers:
                    scheduler.step()
                batches.record_step()
                if hvd.rank() == 0 and args.epoch_file is not None:
                    args.epoch_file.write_text(str(state.step))
                events.write(
                    "step",
                    step=state.step,
                    epoch=state.epoch,
                    rank=hvd.rank(),
                    size=hvd.size(),
                    round=hvd.current_round(),
                    micro_batches=micro.count,
                    samples=trained,
                    lr=[o.param_groups[0]["lr"] for o in now_optimizers.values()],
                    scale=scaler.get_scale() if scaler is not None else None,
                )
                trained = []
                state.step += 1
                if state.step % args.commit_every == 0:
                    state.commit()
            state.epoch += 1
            batches.set_epoch(state.epoch)

    train(state)
    final_models, final_optimizers, _, _ = live()
    path = args.log_dir / "end.pt" if hvd.rank() == 0 else None
    dump_whole(path, final_models, final_optimizers)


if __name__ == "__main__":
    main()
