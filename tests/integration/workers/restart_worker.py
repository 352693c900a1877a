"""A torchrun DDP script, as people write them for torchrun: the group from the environment
(``env://``), ``DistributedDataParallel``, and a checkpoint of its own that rank 0 saves after
every step and every rank resumes from when started again. It never imports elasticjob.

For the tests it also appends what it saw to ``<log-dir>/<pid>.jsonl`` (its environment at
each start, each step, its weights at the end), writes the epoch it reached for a discovery
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

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4, help="steps per epoch")
    parser.add_argument("--step-s", type=float, default=0.0, help="seconds each step lasts")
    parser.add_argument("--epoch-file", type=Path)
    parser.add_argument("--cuda", action="store_true", help="NCCL, on the GPU of LOCAL_RANK")
    parser.add_argument(
        "--await-size",
        metavar="EPOCH:SIZE",
        help="at the start of EPOCH, wait (up to 10 minutes) while the world is smaller than "
        "SIZE: until the job restarts the script in a larger world",
    )
    parser.add_argument(
        "--fail-at",
        action="append",
        default=[],
        help="EPOCH:STEP:RANK:MODE, RANK a rank or 'all', MODE sigkill (once in the job), "
        "sigkill-always, or exit-N (exit code N, every start)",
    )
    return parser.parse_args()


class Log:
    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self._path = folder / f"{os.getpid()}.jsonl"

    def __call__(self, event: str, **fields: object) -> None:
        record = {"ev": event, "time": time.time(), "pid": os.getpid(), **fields}
        with self._path.open("a") as out:
            out.write(json.dumps(record) + "\n")


CHECKPOINTED_WITHIN_S = 30.0
"""How long a kill waits for rank 0's checkpoint of the step before it."""


def checkpointed(checkpoint: Path, epoch: int, step: int) -> None:
    """Wait (bounded) until rank 0's checkpoint holds ``(epoch, step)``: a kill comes after the
    step before it was saved, whatever the agents then stop at once."""
    deadline = time.monotonic() + CHECKPOINTED_WITHIN_S
    while (epoch, step) != (0, 0) and time.monotonic() < deadline:
        try:
            saved = torch.load(checkpoint, map_location="cpu")
            if (saved["epoch"], saved["step"]) == (epoch, step):
                return
        except (OSError, RuntimeError, KeyError, EOFError):
            pass  # not written yet
        time.sleep(0.01)


def maybe_fail(
    spec: list[str], epoch: int, step: int, rank: int, log: Log, checkpoint: Path
) -> None:
    for entry in spec:
        at_epoch, at_step, at_rank, mode = entry.split(":")
        if (int(at_epoch), int(at_step)) != (epoch, step) or at_rank not in ("all", str(rank)):
            continue
        once = log.folder / f"killed-{entry.replace(':', '-')}"
        if (mode == "sigkill" and not once.exists()) or mode == "sigkill-always":
            checkpointed(checkpoint, epoch, step)
            once.touch()
            log("kill", rank=rank, epoch=epoch, step=step)
            os.kill(os.getpid(), signal.SIGKILL)
        if mode.startswith("exit-"):
            print(f"rank {rank}: failing on purpose at {epoch}:{step}", file=sys.stderr)
            sys.exit(int(mode.removeprefix("exit-")))
        if mode == "raise":  # main's @record writes it to TORCHELASTIC_ERROR_FILE
            raise ValueError(f"rank {rank} raised on purpose at {epoch}:{step}")


def await_size(spec: str | None, epoch: int, size: int) -> None:
    if spec is None:
        return
    at_epoch, at_least = (int(part) for part in spec.split(":"))
    if epoch == at_epoch and size < at_least:
        time.sleep(600)  # the agent stops the script once the larger round is formed
        sys.exit(4)


@record
def main() -> None:
    # Forked from the agent's start server: what DistributedDataParallel imports is there
    # already (a cold start imports torch._dynamo only when it builds the model below).
    warm = "torch._dynamo" in sys.modules
    args = parse()
    log = Log(args.log_dir)
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.cuda:
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    epoch, step = 0, 0
    if args.checkpoint.exists():
        saved = torch.load(args.checkpoint, map_location=device)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        epoch, step = saved["epoch"], saved["step"]
    ddp = DistributedDataParallel(model)
    log(
        "start",
        rank=rank,
        size=size,
        epoch=epoch,
        step=step,
        device=str(device),
        host=os.environ.get("HOROVOD_HOSTNAME"),
        backend=dist.get_backend(),
        warm=warm,
        argv=sys.argv,
        env=dict(os.environ),
    )
    # Every rank has logged its start before any goes on to fail: a rank that kills itself
    # at once must not take its peers down before they logged theirs.
    dist.barrier()
    while epoch < args.epochs:
        if rank == 0 and args.epoch_file is not None:
            args.epoch_file.write_text(str(epoch))
        await_size(args.await_size, epoch, size)
        while step < args.steps:
            maybe_fail(args.fail_at, epoch, step, rank, log, args.checkpoint)
            inputs = torch.arange(8 * 4, dtype=torch.float32, device=device).reshape(8, 4)
            inputs /= 1 + epoch + step
            optimizer.zero_grad()
            ddp(inputs).square().mean().backward()
            optimizer.step()
            step += 1
            time.sleep(args.step_s)
            if rank == 0:
                saved = {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "epoch": epoch + (step == args.steps),
                    "step": 0 if step == args.steps else step,
                }
                torch.save(saved, args.checkpoint.with_suffix(".tmp"))
                args.checkpoint.with_suffix(".tmp").replace(args.checkpoint)
            log("step", rank=rank, size=size, epoch=epoch, step=step)
        epoch, step = epoch + 1, 0
    digest = hashlib.sha256(
        b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())
    )
    log("done", rank=rank, size=size, digest=digest.hexdigest())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
