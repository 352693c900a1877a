"""Training script of the elastic DDP tests: a plain DDP loop, no masking anywhere.

The model is the elastic ``DistributedDataParallel`` around a small MLP, the data 97 samples
whose dataset item carries its index, the sampler an ``ElasticSampler(batch_size=4)``, the
loss a plain mean. Each step every rank contributes the indices of its batch when the batch's
step weight is above 0 (what the gradient average actually trained); the union of the ranks'
lists is appended to ``trajectory`` in the committed state. At the end rank 0 writes the
trajectory and the final weights, which the test replays on one process.

Each process appends JSON events (wall-clock times) to ``<out>/events-<pid>.jsonl``; with
``--kill EPOCH:STEP:RANK`` that rank SIGKILLs itself in round 1 in the middle of the backward
pass of that step (the others are then waiting for its gradients). With ``--hold-sockets S``
a forked child keeps the dead worker's sockets open for S seconds, as a peer that lost its
power or network would: no connection reset tells the others, only the driver's notice.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from ddp_model import BATCH_SIZE, Indexed, build_model, build_optimizer  # beside this script
from elastic_worker import wait_for_world
from torch.utils.data import DataLoader

import elasticjob.worker_runtime as hvd
from elasticjob.worker_runtime.training import step_weight


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--commit-every", type=int, default=2)
    parser.add_argument("--step-time", type=float, default=0.0, help="simulated compute")
    parser.add_argument("--kill", default="", help="EPOCH:STEP:RANK, in round 1")
    parser.add_argument("--hold-sockets", type=float, default=0.0, help="after the kill")
    parser.add_argument("--expect-sizes", default="", help="world size each epoch must end with")
    parser.add_argument("--epoch-file", type=Path, help="rank 0 writes the epoch it starts here")
    parser.add_argument("--wait-deadline", type=float, default=120.0)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    log = args.out / f"events-{os.getpid()}.jsonl"

    def event(kind: str, **fields: Any) -> None:
        record = {"ev": kind, "time": time.time(), "pid": os.getpid(), "rank": hvd.rank()}
        record |= {"size": hvd.size(), "round": hvd.current_round(), **fields}
        with log.open("a") as file:
            file.write(json.dumps(record) + "\n")

    kill = tuple(int(x) for x in args.kill.split(":")) if args.kill else None
    expected = [int(s) for s in args.expect_sizes.split(",") if s]
    hvd.init()
    module = build_model()
    model = hvd.elastic.DistributedDataParallel(module)
    optimizer = build_optimizer(module)
    dataset = Indexed()
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=7, batch_size=BATCH_SIZE)
    loader = DataLoader(dataset, batch_size=BATCH_SIZE, sampler=sampler)
    state = hvd.elastic.TorchState(
        model=model, optimizer=optimizer, sampler=sampler, epoch=0, trajectory=[]
    )

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        event("train", ddp=id(model.wrapped))
        while state.epoch < args.epochs:
            if hvd.rank() == 0 and args.epoch_file is not None:
                partial = args.epoch_file.with_name(f"{args.epoch_file.name}.{os.getpid()}")
                partial.write_text(str(state.epoch))
                partial.replace(args.epoch_file)
            for batch_idx, (x, y, index) in enumerate(loader):
                weight = step_weight.pass_weight()
                out = model(x)
                if kill == (state.epoch, batch_idx, hvd.rank()) and hvd.current_round() == 1:
                    out.register_hook(lambda grad: die(event, args.hold_sockets))
                loss = torch.nn.functional.mse_loss(out, y)
                optimizer.zero_grad()
                started = time.time()
                try:
                    loss.backward()
                except RuntimeError as exc:
                    event("raised", where="backward", waited=time.time() - started, error=str(exc))
                    raise
                optimizer.step()
                trained = index.tolist() if weight > 0 else []
                parts = hvd.allgather_object(trained)
                state.trajectory.append(
                    {"epoch": state.epoch, "indices": [i for part in parts for i in part]}
                )
                on_round_group = model.process_group is dist.distributed_c10d._get_default_group()
                event(
                    "step",
                    epoch=state.epoch,
                    batch=batch_idx,
                    weight=weight,
                    batch_len=len(trained),
                    ddp=id(model.wrapped),
                    on_round_group=on_round_group,
                )
                state.sampler.record_batch(batch_idx, BATCH_SIZE)
                if args.step_time:
                    time.sleep(args.step_time)
                if (batch_idx + 1) % args.commit_every == 0:
                    state.commit()
            wait_for_world(state, expected, args.wait_deadline)
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    event("done")
    if hvd.rank() == 0:
        params = [p.detach().reshape(-1).tolist() for p in module.parameters()]
        result = {"trajectory": state.trajectory, "params": params, "size": hvd.size()}
        (args.out / "result.json").write_text(json.dumps(result))
    hvd.shutdown()


def die(event: Any, hold_sockets_s: float) -> None:
    event("kill")
    if hold_sockets_s and os.fork() == 0:
        # The child holds every inherited socket and says nothing. It lets go of the output
        # pipes: the launcher sees a worker end only once they close.
        os.closerange(0, 3)
        time.sleep(hold_sockets_s)
        os._exit(0)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
