"""Worker of the sharded recovery benchmark: a wide MLP (``--layers`` linear layers of
``--dim`` x ``--dim``, each sharded with FSDP2's ``fully_shard``) with AdamW on random data,
one timestamped event per completed step, block, commit, memory sample, sync and scripted kill
in a JSON-lines file per process. Two modes:

- elastic (under ``elasticjob-run``): ``hvd.elastic.ShardedState`` (HSDP with ``--hsdp``: each
  host's ranks shard, the hosts replicate); after ``--warmup`` steps,
  alternating blocks of steps with ``state.commit()`` every ``--commit-every`` steps and
  without commits, then commits every ``--commit-every`` steps, ``--kill-rank`` SIGKILLs
  itself at ``--kill-at``; the survivors take ``--steps-after`` steps in the new round and
  stop. Every rank samples its memory right before the kill, the survivors again after
  their first step in round 2. Where the reshard sent bytes, the survivors then send one
  another as many bytes over plain Gloo (``plain_exchange``, the baseline of its bandwidth);
- restart (under ``torchrun --max-restarts 1``, ``--restart``): plain ``torch.distributed``;
  the first attempt saves a ``torch.distributed.checkpoint`` at ``--save-at`` and
  ``--kill-rank`` SIGKILLs itself at ``--kill-at``; torchrun restarts every process, which
  loads the checkpoint into a freshly sharded model and takes one step. The restarted
  processes log when they started (before ``import torch``), imported torch, formed the
  group, built the model, loaded the checkpoint and completed the step.
"""

from __future__ import annotations

import time

STARTED = time.time()  # before torch is imported: when the interpreter started this script

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

IMPORTED = time.time()

import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402

Log = Callable[..., None]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--commit-every", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3, help="steps before the A/B run")
    parser.add_argument("--block", type=int, default=20, help="steps per block of the A/B run")
    parser.add_argument("--blocks", type=int, default=6, help="blocks of the A/B run")
    parser.add_argument("--kill-at", type=int, default=0, help="default: 3 steps past a commit")
    parser.add_argument("--kill-rank", type=int, default=3)
    parser.add_argument("--steps-after", type=int, default=3, help="steps in the new round")
    parser.add_argument("--hsdp", action="store_true", help="HSDP: shard in a host, replicate")
    parser.add_argument("--restart", action="store_true", help="torchrun's restart path")
    parser.add_argument("--checkpoint", type=Path, help="the restart path's DCP folder")
    parser.add_argument("--save-at", type=int, default=2, help="the restart path saves here")
    return parser.parse_args()


def memory() -> dict[str, int]:
    """This process's resident memory and its high-water mark, in bytes."""
    found = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            found[name.lower()] = int(value.split()[0]) * 1024
    return found


def build(
    mesh: DeviceMesh, dim: int, layers: int, initialize: bool
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The MLP on the meta device, each layer and the whole sharded over ``mesh``, made real
    on the CPU (initialized only when ``initialize``: loaded state replaces it otherwise)."""
    with torch.device("meta"):
        blocks: list[torch.nn.Module] = []
        for _ in range(layers):
            blocks += [torch.nn.Linear(dim, dim), torch.nn.ReLU()]
        model = torch.nn.Sequential(*blocks[:-1])
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    if initialize:
        generator = torch.Generator().manual_seed(mesh.get_local_rank(mesh.ndim - 1))
        with torch.no_grad():
            for param in model.parameters():
                assert isinstance(param, DTensor)
                param.to_local().normal_(0.0, dim**-0.5, generator=generator)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def training_step(
    dim: int, batch_size: int
) -> Callable[[torch.nn.Module, torch.optim.Optimizer], None]:
    x, y = torch.randn(batch_size, dim), torch.randn(batch_size, dim)

    def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()

    return step


class EventLog(logging.Handler):
    """Every log record of the worker runtime as a timestamped event of the JSON-lines file."""

    def __init__(self, write: Callable[[str], Any]) -> None:
        super().__init__()
        self.write = write

    def emit(self, record: logging.LogRecord) -> None:
        self.write(json.dumps({"ev": "log", "t": record.created, "pid": os.getpid(),
                               "msg": record.getMessage()}) + "\n")  # fmt: skip


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    out = (args.log_dir / f"{os.getpid()}.jsonl").open("a", buffering=1)

    def log(event: str, **fields: Any) -> None:
        record = {"ev": event, "t": time.time(), "pid": os.getpid(), **fields}
        out.write(json.dumps(record) + "\n")

    if args.restart:
        restart_path(args, log)
    else:
        logging.getLogger("elasticjob").addHandler(EventLog(out.write))
        elastic_path(args, log)
    out.flush()


def elastic_path(args: argparse.Namespace, log: Log) -> None:
    import elasticjob.worker_runtime as hvd  # noqa: PLC0415 (the restart path never imports it)

    hvd.init()
    step = training_step(args.dim, args.batch_size)
    ab_end = args.warmup + args.block * args.blocks
    kill_at = args.kill_at or ab_end + args.commit_every + 3  # 3 steps past a commit

    def make(mesh: DeviceMesh) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        return build(mesh, args.dim, args.layers, initialize=not state.restoring)

    state = hvd.elastic.ShardedState(make, redundancy=1, hsdp=args.hsdp, step=0)

    def commits_in_block(block: int) -> bool:
        """Blocks alternate C P, P C, C P ... so both kinds see the same machine load."""
        return (block % 2 == 0) == (block // 2 % 2 == 0)

    @hvd.elastic.run
    def train(state: hvd.elastic.ShardedState) -> None:
        assert state.last_sync is not None
        round_number, rank = hvd.current_round(), hvd.rank()
        log("sync", round=round_number, rank=rank, **dataclasses.asdict(state.last_sync))
        if round_number == 2 and state.last_sync.sent_bytes:
            sent = state.last_sync.sent_bytes
            log("baseline", rank=rank, bytes=sent, seconds=plain_exchange(sent))
        started_at = state.step
        block_started = 0.0
        while round_number == 1 or state.step < started_at + args.steps_after:
            if round_number == 1 and state.step == kill_at:
                log("memory", when="steady", rank=rank, **memory())
                if rank == args.kill_rank:
                    log("kill", step=state.step, rank=rank)
                    os.kill(os.getpid(), signal.SIGKILL)
            in_ab = round_number == 1 and args.warmup <= state.step < ab_end
            block = (state.step - args.warmup) // args.block
            if in_ab and (state.step - args.warmup) % args.block == 0:
                hvd.allreduce(torch.zeros(1))  # align ranks before timing
                block_started = time.perf_counter()
            assert state.model is not None and state.optimizer is not None
            step(state.model, state.optimizer)
            state.step += 1
            log(
                "step",
                step=state.step,
                rank=rank,
                size=hvd.size(),
                round=round_number,
                state_copy_wait_s=state.state_copy_wait_s,
            )
            if round_number > 1 and state.step == started_at + 1:
                log("memory", when="recovered", rank=rank, **memory())
            due = round_number == 1 and (state.step - args.warmup) % args.commit_every == 0
            if due and (commits_in_block(block) or not in_ab):
                held_up = time.perf_counter()
                state.commit()
                held_up = time.perf_counter() - held_up
                # copy_seconds: the previous commit's copies, settled in this one
                log("commit", rank=rank, seconds=held_up, copies=state.copy_seconds,
                    step=state.step)  # fmt: skip
            if in_ab and (state.step - args.warmup) % args.block == 0 and rank == 0:
                seconds = (time.perf_counter() - block_started) / args.block
                log("block", commits=commits_in_block(block), step_s=seconds)

    train(state)
    hvd.shutdown()


def plain_exchange(total_bytes: int) -> float:
    """Seconds for the round's ranks to send one another ``total_bytes`` in all over Gloo,
    each its share to the next rank in a ring, in one batch of sends and receives: what the
    reshard moved, without its plan (the baseline of its bandwidth)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    count = total_bytes // size // 4
    outgoing, incoming = torch.ones(count), torch.empty(count)
    dist.barrier()
    started = time.perf_counter()
    operations = [
        dist.P2POp(dist.isend, outgoing, (rank + 1) % size),
        dist.P2POp(dist.irecv, incoming, (rank - 1) % size),
    ]
    for work in dist.batch_isend_irecv(operations):
        work.wait()
    return time.perf_counter() - started


def restart_path(args: argparse.Namespace, log: Log) -> None:
    """One attempt of torchrun's: the first trains, saves and loses a rank; the second loads
    the checkpoint and takes one step."""
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    log("started", attempt=attempt, rank=rank, started=STARTED, imported=IMPORTED)
    # the agent's store outlives an attempt: a key prefix per attempt keeps the restarted
    # group from reading the dead group's addresses
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world)
    prefixed = dist.PrefixStore(f"attempt-{attempt}", store)
    dist.init_process_group("gloo", store=prefixed, rank=rank, world_size=world)
    log("group", attempt=attempt, rank=rank)
    mesh = init_device_mesh("cpu", (world,))
    model, optimizer = build(mesh, args.dim, args.layers, initialize=attempt == 0)
    log("built", attempt=attempt, rank=rank)
    step = training_step(args.dim, args.batch_size)
    if attempt > 0:
        model_state, optimizer_state = get_state_dict(model, optimizer)
        dcp.load({"model": model_state, "optim": optimizer_state}, checkpoint_id=args.checkpoint)
        set_state_dict(
            model, optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state
        )
        log("loaded", attempt=attempt, rank=rank)
        step(model, optimizer)
        log("step", attempt=attempt, rank=rank, step=args.save_at + 1)
        dist.barrier()
        os._exit(0)  # measured; a torchrun worker's teardown of the group can abort
    for number in range(1, args.kill_at + 1):
        if number == args.kill_at and rank == args.kill_rank:
            log("kill", step=number, rank=rank)
            os.kill(os.getpid(), signal.SIGKILL)
        step(model, optimizer)
        log("step", attempt=attempt, rank=rank, step=number)
        if number == args.save_at:
            started = time.monotonic()
            model_state, optimizer_state = get_state_dict(model, optimizer)
            dcp.save(
                {"model": model_state, "optim": optimizer_state}, checkpoint_id=args.checkpoint
            )
            log("saved", rank=rank, seconds=time.monotonic() - started)
    dist.barrier()  # the survivors wait here for the dead rank until torchrun stops them


if __name__ == "__main__":
    main()
