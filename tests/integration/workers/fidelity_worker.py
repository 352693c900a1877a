"""Training script of the fidelity tests: the same small training loop written twice, once
with plain torch (``--mode plain``: ``init_process_group``, torch's DDP or FSDP2, no
elasticjob) and once with elasticjob's elastic state (``--mode elastic``, under the
launcher), so that the tests can compare their ends bit for bit.

Families:
- ``torch``: four MLPs trained side by side on the same batches: AdamW (weight decay) and SGD
  (momentum), each once under ``hvd.DistributedOptimizer`` and once under the elastic
  ``DistributedDataParallel``, all in one ``TorchState``; the plain loop wraps all four in
  torch's DDP;
- ``sharded``: two MLPs sharded with FSDP2, one in fp32 and one with a bf16
  ``MixedPrecisionPolicy``, one optimizer (``--optimizer``), a ``ShardedState``.

Every rank takes the batch of the step and rank (``batch_of``), in both modes. ``--fail
STEP:RANK`` SIGKILLs a rank once it reaches a step. (``global_batch_worker.py`` trains these
models with learning-rate schedules and a loss scale, from the helpers here.) At the end
every rank writes its parameters (its shards) and optimizer state to
``<log-dir>/elastic-rank-<rank>.pt``, or ``plain-<world>-from-<step>-rank-<rank>.pt``. An
elastic run saves the commit of step ``--save-commit`` to ``<log-dir>/commit`` (and writes it
as ``commit-rank-<rank>.pt``), and a plain run restarts from it with ``--resume-from`` (at
``--start-step``), on a world of its own: its ``--ranks`` processes forked from one.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as TorchDDP

FEATURES, HIDDEN, OUTPUTS, BATCH, SAMPLES = 8, 24, 3, 4, 96
TORCH_MODELS = ("distopt-adamw", "distopt-sgd", "ddp-adamw", "ddp-sgd")
SHARDED_MODELS = ("fp32", "bf16")
LR = {"adamw": 0.01, "sgd": 0.05}
GAMMA = 0.9
SCHEDULES = dict(zip(TORCH_MODELS, ("step", "lambda", "onecycle", "sequential"), strict=True))
"""Each torch-family model's schedule where one job keeps all four (``schedule_of``)."""


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--mode", choices=("plain", "elastic"), required=True)
    parser.add_argument("--family", choices=("torch", "sharded"), required=True)
    parser.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--commit-every", type=int, default=3)
    parser.add_argument("--fail", default="", help="STEP:RANK: SIGKILL that rank at that step")
    parser.add_argument("--save-commit", type=int, help="elastic: save the commit of this step")
    parser.add_argument("--store", type=Path, help="plain: the file store the processes meet at")
    parser.add_argument("--resume-from", type=Path, help="plain: start from a saved commit")
    parser.add_argument("--start-step", type=int, default=0, help="plain: its step")
    parser.add_argument(
        "--stacks-after", type=float, help="plain: write every thread's stack after this long"
    )
    parser.add_argument(
        "--ranks", type=int, default=1, help="plain: the world's ranks, forked from this process"
    )
    return parser.parse_args()


def split_pair(text: str, default: tuple[int, int]) -> tuple[int, int]:
    """``"A:B"`` (a ``--fail`` or ``--await-size``) as two ints (``default`` for an empty
    text)."""
    if not text:
        return default
    first, second = text.split(":")
    return int(first), int(second)


def data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return (
        torch.randn(SAMPLES, FEATURES, generator=generator),
        torch.randn(SAMPLES, OUTPUTS, generator=generator),
    )


def batch_of(step: int, rank: int, world: int) -> torch.Tensor:
    """The sample indices of ``rank``'s batch at ``step`` (the same in both modes)."""
    start = (step * world + rank) * BATCH
    return torch.arange(start, start + BATCH) % SAMPLES


def mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUTPUTS)
    )


def make_optimizer(kind: str, params: Any) -> torch.optim.Optimizer:
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=LR["adamw"], weight_decay=0.05)
    return torch.optim.SGD(params, lr=LR["sgd"], momentum=0.9, weight_decay=0.01)


def schedule_of(model: str, scheduler: str) -> str:
    """The schedule ``model`` follows where ``scheduler`` is ``mixed`` (one per model), else
    ``scheduler``."""
    return SCHEDULES.get(model, "sequential") if scheduler == "mixed" else scheduler


def make_scheduler(kind: str, optimizer: torch.optim.Optimizer, steps: int) -> Any:
    sched = torch.optim.lr_scheduler
    if kind == "step":
        return sched.StepLR(optimizer, 1, GAMMA)
    if kind == "lambda":
        return sched.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    if kind == "onecycle":
        lr = optimizer.param_groups[0]["lr"]
        return sched.OneCycleLR(optimizer, max_lr=lr * 4, total_steps=steps + 1)
    warmup = sched.LinearLR(optimizer, start_factor=0.25, total_iters=3)
    return sched.SequentialLR(
        optimizer, [warmup, sched.StepLR(optimizer, 1, GAMMA)], milestones=[3]
    )


def build_sharded(
    mesh: DeviceMesh, optimizer_kind: str, scheduler: str, steps: int
) -> tuple[torch.nn.Module, torch.optim.Optimizer] | tuple[Any, ...]:
    models = torch.nn.ModuleDict({"fp32": mlp(1), "bf16": mlp(2)})
    policies = {
        "fp32": MixedPrecisionPolicy(),
        "bf16": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
    }
    for name, model in models.items():
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh, mp_policy=policies[name])
        fully_shard(model, mesh=mesh, mp_policy=policies[name])
    optimizer = make_optimizer(optimizer_kind, models.parameters())
    if scheduler != "none":
        return models, optimizer, make_scheduler(scheduler, optimizer, steps)
    return models, optimizer


def local(tensor: torch.Tensor) -> torch.Tensor:
    value = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return value.detach().clone()


def dump(path: Path, models: dict[str, torch.nn.Module], optimizers: dict[str, Any]) -> None:
    """Each model's parameters (this rank's shards) and its optimizer's state, by name."""
    out: dict[str, Any] = {}
    for name, model in models.items():
        optimizer = optimizers[name]
        params = dict(model.named_parameters())
        out[name] = {
            "params": {n: local(p) for n, p in params.items()},
            "optimizer": {
                f"{n}.{key}": local(value) if isinstance(value, torch.Tensor) else value
                for n, p in params.items()
                for key, value in optimizer.state.get(p, {}).items()
            },
            "lr": [group["lr"] for group in optimizer.param_groups],
        }
    torch.save(out, path)


class Events:
    def __init__(self, log_dir: Path, rank: int) -> None:
        self._path = log_dir / f"events-{rank}-{os.getpid()}.jsonl"

    def write(self, event: str, **fields: Any) -> None:
        with self._path.open("a") as f:
            f.write(json.dumps({"ev": event, "pid": os.getpid(), "time": time.time(), **fields}))
            f.write("\n")


def step_models(
    models: dict[str, Any], optimizers: dict[str, Any], x: torch.Tensor, y: torch.Tensor
) -> None:
    """One step of each model."""
    for name, model in models.items():
        optimizers[name].zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizers[name].step()


def plain(args: argparse.Namespace) -> None:
    if args.stacks_after is not None:
        faulthandler.dump_traceback_later(args.stacks_after, exit=False)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{args.store}",
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timedelta(seconds=60),
    )
    rank, world = dist.get_rank(), dist.get_world_size()
    features, targets = data()
    models: dict[str, Any] = {}
    if args.family == "torch":
        modules = {name: mlp(i) for i, name in enumerate(TORCH_MODELS)}
        optimizers = {
            name: make_optimizer(name.split("-")[1], m.parameters()) for name, m in modules.items()
        }
        if args.resume_from is not None:
            load_commit(args.resume_from, modules, optimizers)
        models = {name: TorchDDP(m) for name, m in modules.items()}
        dumped, dumped_optimizers = modules, optimizers
    else:
        mesh = init_device_mesh("cpu", (world,))
        model, optimizer = build_sharded(mesh, args.optimizer, "none", args.steps)
        if args.resume_from is not None:
            load_commit(args.resume_from, {"sharded": model}, {"sharded": optimizer})
        dumped = {name: model[name] for name in SHARDED_MODELS}
        dumped_optimizers = dict.fromkeys(SHARDED_MODELS, optimizer)
    for step in range(args.start_step, args.steps):
        indices = batch_of(step, rank, world)
        if args.family == "sharded":
            sharded_step(model, optimizer, features[indices], targets[indices])
        else:
            step_models(models, optimizers, features[indices], targets[indices])
    name = f"plain-{world}-from-{args.start_step}-rank-{rank}.pt"
    dump(args.log_dir / name, dumped, dumped_optimizers)
    # torch's DDP wrappers go, and every rank is done with the group, before the group: a
    # DDP reducer left to the end of this function once hung its process in 4 runs of 8,
    # its peer already gone.
    models.clear()
    dist.barrier()
    dist.destroy_process_group()


def sharded_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor
) -> None:
    loss = sum(torch.nn.functional.mse_loss(model[n](x), y) for n in SHARDED_MODELS)
    optimizer.zero_grad()
    loss.backward()  # type: ignore[union-attr]
    optimizer.step()


def save_commit(path: Path, models: dict[str, Any], optimizers: dict[str, Any]) -> None:
    """The state just committed, for a plain run that restarts from it: the torch family's
    (whole on every rank) by rank 0 with ``torch.save``, the sharded one's by every rank with
    ``torch.distributed.checkpoint`` (a plain restart reshards it onto its own world)."""
    if "sharded" in models:
        model_state, optimizer_state = get_state_dict(models["sharded"], optimizers["sharded"])
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=path)
    elif dist.get_rank() == 0:
        saved = {
            name: {
                "model": getattr(model, "module", model).state_dict(),
                "optimizer": optimizers[name].state_dict(),
            }
            for name, model in models.items()
        }
        path.mkdir(parents=True, exist_ok=True)
        torch.save(saved, path / "state.pt")


def load_commit(path: Path, models: dict[str, Any], optimizers: dict[str, Any]) -> None:
    """Load what :func:`save_commit` wrote into the plain run's models and optimizers."""
    if "sharded" in models:
        model, optimizer = models["sharded"], optimizers["sharded"]
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
        )
        return
    saved = torch.load(path / "state.pt")
    for name, model in models.items():
        model.load_state_dict(saved[name]["model"])
        optimizers[name].load_state_dict(saved[name]["optimizer"])


def elastic(args: argparse.Namespace) -> None:
    # Imported here: the plain loop runs without elasticjob in its process.
    import elasticjob.worker_runtime as hvd  # noqa: PLC0415

    hvd.init()
    features, targets = data()
    events = Events(args.log_dir, hvd.rank())
    fail_step, fail_rank = split_pair(args.fail, (-1, -1))
    fired = args.log_dir / "fired"
    if args.family == "torch":
        modules = {name: mlp(i) for i, name in enumerate(TORCH_MODELS)}
        models: dict[str, Any] = {}
        optimizers: dict[str, Any] = {}
        for name, module in modules.items():
            optimizer = make_optimizer(name.split("-")[1], module.parameters())
            if name.startswith("distopt"):
                models[name] = module
                optimizers[name] = hvd.DistributedOptimizer(
                    optimizer, named_parameters=module.named_parameters()
                )
            else:
                models[name] = hvd.elastic.DistributedDataParallel(module)
                optimizers[name] = optimizer
        kept: dict[str, Any] = {f"model_{n}": m for n, m in models.items()}
        kept.update({f"optimizer_{n}": o for n, o in optimizers.items()})
        state: Any = hvd.elastic.TorchState(step=0, **kept)
    else:

        def build(mesh: DeviceMesh) -> Any:
            return build_sharded(mesh, args.optimizer, "none", args.steps)

        state = hvd.elastic.ShardedState(build, step=0)

    def live() -> tuple[dict[str, Any], dict[str, Any]]:
        """The models and optimizers the state holds now (a sharded state builds new ones
        every round)."""
        if args.family == "torch":
            return models, optimizers
        return {"sharded": state.model}, {"sharded": state.optimizer}

    @hvd.elastic.run
    def train(state: Any) -> None:
        while state.step < args.steps:
            if state.step == fail_step and hvd.rank() == fail_rank and not fired.exists():
                fired.touch()
                os.kill(os.getpid(), signal.SIGKILL)
            now_models, now_optimizers = live()
            indices = batch_of(state.step, hvd.rank(), hvd.size())
            x, y = features[indices], targets[indices]
            if args.family == "sharded":
                sharded_step(now_models["sharded"], now_optimizers["sharded"], x, y)
            else:
                step_models(now_models, now_optimizers, x, y)
            events.write(
                "step", step=state.step, rank=hvd.rank(), size=hvd.size(),
                round=hvd.current_round(),
            )  # fmt: skip
            state.step += 1
            if state.step % args.commit_every == 0:
                state.commit()
                if state.step == args.save_commit:
                    save_commit(args.log_dir / "commit", now_models, now_optimizers)
                    dump(
                        args.log_dir / f"commit-rank-{hvd.rank()}.pt",
                        *by_model(now_models, now_optimizers),
                    )

    train(state)
    final_models, final_optimizers = live()
    dump(args.log_dir / f"elastic-rank-{hvd.rank()}.pt", *by_model(final_models, final_optimizers))


def wait_for_world(state: Any, size: int, deadline_s: float = 120.0) -> None:
    """Check for host updates until the world has at least ``size`` ranks (the host update
    ends the round: the loop resumes at this step in the larger world)."""
    import elasticjob.worker_runtime as hvd  # noqa: PLC0415 (see elastic())

    deadline = time.monotonic() + deadline_s
    while hvd.size() < size:
        if time.monotonic() > deadline:
            raise RuntimeError(f"world size {hvd.size()} never reached {size}")
        state.check_host_updates()
        time.sleep(0.02)


def by_model(
    models: dict[str, Any], optimizers: dict[str, Any]
) -> tuple[dict[str, torch.nn.Module], dict[str, Any]]:
    """The modules to dump and their optimizers, by model name (the sharded family's two
    MLPs share one optimizer; a DDP wrapper is dumped as its module)."""
    if "sharded" in models:
        model = models["sharded"]
        return (
            {name: model[name] for name in SHARDED_MODELS},
            dict.fromkeys(SHARDED_MODELS, optimizers["sharded"]),
        )
    return {n: getattr(m, "module", m) for n, m in models.items()}, optimizers


def plain_world(args: argparse.Namespace) -> int:
    """Run the plain loop as each of ``--ranks`` processes (``RANK`` and ``WORLD_SIZE`` set),
    forked from this one once torch is imported: a world costs one interpreter's imports.
    Returns 1 if any rank failed."""
    children: dict[int, int] = {}
    for rank in range(args.ranks):
        pid = os.fork()
        if pid == 0:
            os.environ |= {"RANK": str(rank), "WORLD_SIZE": str(args.ranks)}
            code = 1
            try:
                plain(args)
                code = 0
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children[pid] = rank
    failed = []
    while children:
        pid, status = os.wait()
        rank = children.pop(pid)
        if os.waitstatus_to_exitcode(status) != 0:
            failed.append(rank)
    if failed:
        print(f"plain ranks {sorted(failed)} failed", file=sys.stderr)
    return 1 if failed else 0


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    if args.mode == "elastic":
        elastic(args)
    else:
        sys.exit(plain_world(args))


if __name__ == "__main__":
    main()
