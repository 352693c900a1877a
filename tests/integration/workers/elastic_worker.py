"""Training script of the multi-process tests: a small MLP on synthetic data, with scripted
failures and an event log per process.

Exactly-once accounting rides in the model itself: the buffer ``seen`` counts, per sample,
how often it was trained (padding excluded), summed over ranks with an allreduce at every
step. It is committed, restored and synced exactly like the weights, so at the end it tells
what the *committed trajectory* trained: every entry must equal the number of epochs.

Each epoch ends only once the world has the size the test expects for it (the discovery
schedule changes hosts when rank 0 starts an epoch), which makes per-epoch assertions
deterministic.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import select
import signal
import time
import urllib.parse
from pathlib import Path
from typing import Any

import torch
from markers import await_markers  # beside this script (run by path)
from place import place
from torch.utils.data import DataLoader, TensorDataset

import elasticjob.worker_runtime as hvd
from elasticjob.script_env import SCRIPT_ROUND_ENV
from elasticjob.worker_contract import (
    ENV_HOSTNAME,
    ENV_JOB,
    ENV_LOCAL_RANK,
    ENV_RENDEZVOUS_URL,
    SCRIPT_LAUNCH_ENV,
)


class Model(torch.nn.Module):
    def __init__(self, samples: int, features: int, hidden: int) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 4)
        )
        self.register_buffer("seen", torch.zeros(samples, dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--commit-every", type=int, default=2)
    parser.add_argument("--step-time", type=float, default=0.0, help="simulated compute per step")
    parser.add_argument("--expect-sizes", default="", help="world size each epoch must end with")
    parser.add_argument("--epoch-file", type=Path, help="rank 0 writes the epoch it starts here")
    parser.add_argument(
        "--fail",
        action="append",
        default=[],
        help="EPOCH:BATCH:RANK:MODE, MODE in exception|sigkill|sigstop|internal|partition|"
        "partition-rollback|suspend (suspend: SIGUSR1 to the launcher, which suspends the job; "
        "training goes on until the job stops; internal: a one-sided HorovodInternalError on "
        "that rank just before "
        "the commit after BATCH; nothing exits; partition: ask the test, through --cut-fifo, to "
        "cut this process off from its peers, and train on once it did; partition-rollback: "
        "then fail one-sidedly, so this process comes to the next round)",
    )
    parser.add_argument(
        "--cut-fifo", type=Path, help="where a partition is asked for (and FIFO.done answers)"
    )
    parser.add_argument(
        "--slow",
        action="append",
        default=[],
        help="EPOCH:BATCH:RANK:SECONDS: that rank's step takes this much longer, once",
    )
    parser.add_argument("--wait-deadline", type=float, default=90.0)
    parser.add_argument("--stop-file", type=Path, help="finish after the epoch in which it appears")
    parser.add_argument(
        "--process-set",
        action="store_true",
        help="make a process set of the even ranks in every round (at the top of the elastic "
        "function) and reduce over it every step",
    )
    parser.add_argument(
        "--record-env",
        action="store_true",
        help="log the script variables and torch.distributed's view at start, after init() "
        "and after every reset (an all_reduce on the default group included)",
    )
    return parser.parse_args()


class EventLog:
    def __init__(self, log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        host = os.environ.get(ENV_HOSTNAME, "standalone")
        slot = os.environ.get(ENV_LOCAL_RANK, "0")
        self._path = log_dir / f"{host}-{slot}-{os.getpid()}.jsonl"

    def write(self, event: str, **fields: Any) -> None:
        record = {
            "ev": event,
            "host": os.environ.get(ENV_HOSTNAME, "standalone"),
            "slot": int(os.environ.get(ENV_LOCAL_RANK, "0")),
            "pid": os.getpid(),
            "time": time.time(),
            **fields,
        }
        with self._path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def maybe_fail(
    args: argparse.Namespace, log: EventLog, epoch: int, batch: int, *, before_commit: bool = False
) -> None:
    for spec in args.fail:
        e, b, r, mode = spec.split(":")
        if (int(e), int(b), int(r)) != (epoch, batch, hvd.rank()):
            continue
        if (mode == "internal") != before_commit:
            continue
        marker = args.log_dir / f"fired-{spec.replace(':', '_')}"
        try:
            marker.touch(exist_ok=False)  # every scripted failure fires once
        except FileExistsError:
            continue
        log.write("fail", epoch=epoch, batch=batch, rank=hvd.rank(), mode=mode)
        if mode.startswith("partition"):
            ask_for_the_cut(args.cut_fifo)
            if mode == "partition-rollback":
                raise hvd.HorovodInternalError(f"scripted one-sided failure after the cut at {b}")
            return
        if mode == "suspend":
            os.kill(os.getppid(), signal.SIGUSR1)
            return
        if mode == "sigkill":
            others_fired(args, spec)
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "sigstop":  # frozen: every thread stops, the process stays
            os.kill(os.getpid(), signal.SIGSTOP)
        if mode == "internal":
            # One-sided: the other ranks make this commit, and only then does this one fail
            # (else the driver's notice may stop them before it, and every rank would roll
            # back to the same commit).
            await_markers([committed_marker(args.log_dir, epoch, batch)], MARKERS_WITHIN_S)
            raise hvd.HorovodInternalError(
                f"scripted one-sided collective failure at {epoch}:{batch}"
            )
        raise RuntimeError(f"scripted failure at epoch {epoch} batch {batch}")


MARKERS_WITHIN_S = 30.0
"""How long a scripted failure waits for the marker files it waits on (another rank's commit,
or the other SIGKILLs of its batch firing)."""


def committed_marker(log_dir: Path, epoch: int, batch: int) -> Path:
    """The file rank 0 makes once it committed after ``batch`` of ``epoch``."""
    return log_dir / f"committed-{epoch}-{batch}"


def mark_commits(state: hvd.elastic.TorchState, args: argparse.Namespace) -> None:
    """On rank 0, where a one-sided failure is scripted: after each snapshot of the batches
    it names, make :func:`committed_marker` (the snapshot is the commit's first part, before
    any collective)."""
    internal = {
        (int(e), int(b))
        for e, b, _, mode in (spec.split(":") for spec in args.fail)
        if mode == "internal"
    }
    if not internal:
        return
    save = state.save

    def save_and_mark() -> None:
        save()
        done = (state.epoch, state.batch - 1)
        if hvd.rank() == 0 and done in internal:
            committed_marker(args.log_dir, *done).touch()

    state.save = save_and_mark  # type: ignore[method-assign]


def others_fired(args: argparse.Namespace, spec: str) -> None:
    """Wait (bounded) until every SIGKILL scripted for the batch of ``spec`` fired: the ranks
    killed "at once" all die, though the first death may end the job before a slower rank got
    there."""
    epoch_batch = spec.split(":")[:2]
    await_markers(
        [
            args.log_dir / f"fired-{other.replace(':', '_')}"
            for other in args.fail
            if other.split(":")[:2] == epoch_batch and other.endswith(":sigkill")
        ],
        MARKERS_WITHIN_S,
    )


def ask_for_the_cut(fifo: Path, deadline_s: float = 30.0) -> None:
    """Ask the test to cut this process's network but to the rendezvous; return once it did."""
    done = os.open(f"{fifo}.done", os.O_RDWR | os.O_NONBLOCK)  # never waits for a writer
    try:
        rendezvous_port = urllib.parse.urlsplit(os.environ[ENV_RENDEZVOUS_URL]).port
        with fifo.open("w") as request:
            request.write(f"{os.getpid()} {rendezvous_port}\n")
        readable, _, _ = select.select([done], [], [], deadline_s)
        if not readable:
            raise RuntimeError(f"the test did not cut within {deadline_s} s")
        os.read(done, 100)
    finally:
        os.close(done)


def maybe_slow(args: argparse.Namespace, log: EventLog, epoch: int, batch: int) -> None:
    for spec in args.slow:
        e, b, r, seconds = spec.split(":")
        if (int(e), int(b), int(r)) != (epoch, batch, hvd.rank()):
            continue
        marker = args.log_dir / f"slowed-{spec.replace(':', '_')}"
        try:
            marker.touch(exist_ok=False)
        except FileExistsError:
            continue
        log.write("slow", epoch=epoch, batch=batch, rank=hvd.rank(), seconds=float(seconds))
        time.sleep(float(seconds))  # the other ranks wait in this step's gradient allreduce


SCRIPT_ENV = sorted(SCRIPT_LAUNCH_ENV | SCRIPT_ROUND_ENV)


def record_env(log: EventLog, phase: str, *, collective: bool) -> None:
    """Log the script variables in ``os.environ`` and, with ``collective``, what the default
    ``torch.distributed`` group says (an all_reduce of ones on it, with no group argument)."""
    env = {name: os.environ.get(name) for name in SCRIPT_ENV}
    fields: dict[str, Any] = {"phase": phase, "env": env, "job": os.environ.get(ENV_JOB)}
    if collective:
        ones = torch.ones(1)
        torch.distributed.all_reduce(ones)
        fields |= {
            **place(),
            "dist_initialized": torch.distributed.is_initialized(),
            "dist_rank": torch.distributed.get_rank(),
            "dist_size": torch.distributed.get_world_size(),
            "dist_sum": int(ones.item()),
        }
    log.write("env", **fields)


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    log = EventLog(args.log_dir)
    torch.set_num_threads(1)
    if args.record_env:
        record_env(log, "launch", collective=False)
    hvd.init()
    if args.record_env:
        record_env(log, "init", collective=True)
    expected = [int(s) for s in args.expect_sizes.split(",") if s]

    generator = torch.Generator().manual_seed(0)
    features = torch.randn(args.samples, 8, generator=generator)
    labels = torch.randint(0, 4, (args.samples,), generator=generator)
    dataset = TensorDataset(features, labels, torch.arange(args.samples))

    torch.manual_seed(1234)
    model = Model(args.samples, 8, args.hidden)
    base_lr = 0.01
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=base_lr * hvd.size(), momentum=0.9)
    )
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=7)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    state = hvd.elastic.TorchState(
        model=model, optimizer=optimizer, sampler=sampler, epoch=0, batch=0
    )

    def on_reset() -> None:
        for group in optimizer.param_groups:
            group["lr"] = base_lr * hvd.size()
        log.write("reset", round=hvd.current_round(), rank=hvd.rank(), size=hvd.size())
        if args.record_env:
            record_env(log, "reset", collective=True)

    state.register_reset_callbacks([on_reset])
    mark_commits(state, args)
    log.write("start", round=hvd.current_round(), rank=hvd.rank(), size=hvd.size())

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        evens = None
        if args.process_set and hvd.size() > 1:  # every member, in every round
            evens = hvd.add_process_set([r for r in range(hvd.size()) if r % 2 == 0])
        while state.epoch < args.epochs:
            if hvd.rank() == 0 and args.epoch_file is not None:
                # Atomically: a discovery script reading a half-written file would see epoch
                # 0 and drop the hosts the schedule added since.
                partial = args.epoch_file.with_name(f"{args.epoch_file.name}.{os.getpid()}")
                partial.write_text(str(state.epoch))
                partial.replace(args.epoch_file)
            real = state.sampler.num_real_samples
            for batch_idx, (x, y, idx) in enumerate(loader):
                maybe_fail(args, log, state.epoch, state.batch)
                position = torch.arange(
                    batch_idx * args.batch_size, batch_idx * args.batch_size + len(idx)
                )
                weight = (position < real).float()
                optimizer.zero_grad()
                loss = (
                    torch.nn.functional.cross_entropy(model(x), y, reduction="none") * weight
                ).mean()
                loss.backward()
                maybe_slow(args, log, state.epoch, state.batch)
                optimizer.step()
                counts = torch.bincount(idx[weight.bool()], minlength=args.samples)
                model.seen += hvd.allreduce(counts, op=hvd.Sum)
                if evens is not None and evens.included():
                    members = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=evens)
                    log.write("set_sum", round=hvd.current_round(), size=hvd.size(),
                              rank=hvd.rank(), members=int(members.item()))  # fmt: skip
                if args.step_time:
                    time.sleep(args.step_time)
                state.sampler.record_batch(batch_idx, args.batch_size)
                log.write(
                    "step",
                    epoch=state.epoch,
                    batch=state.batch,
                    round=hvd.current_round(),
                    rank=hvd.rank(),
                    size=hvd.size(),
                )
                state.batch += 1
                if state.batch % args.commit_every == 0:
                    maybe_fail(args, log, state.epoch, state.batch - 1, before_commit=True)
                    state.commit()
            wait_for_world(state, expected, args.wait_deadline)
            log.write(
                "epoch_end",
                epoch=state.epoch,
                round=hvd.current_round(),
                rank=hvd.rank(),
                size=hvd.size(),
            )
            hvd.report_progress(state.epoch, state.batch)
            state.epoch += 1
            state.batch = 0
            if args.stop_file is not None and hvd.broadcast_object(args.stop_file.exists(), 0):
                args.epochs = state.epoch
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().numpy().tobytes())
    seen = model.seen
    log.write(
        "done",
        round=hvd.current_round(),
        rank=hvd.rank(),
        size=hvd.size(),
        digest=digest.hexdigest(),
        seen_min=int(seen.min()),
        seen_max=int(seen.max()),
        processed=state.sampler.processed_num,
        epochs=state.epoch,
    )
    hvd.shutdown()


def wait_for_world(state: hvd.elastic.TorchState, expected: list[int], deadline_s: float) -> None:
    """End the epoch only once the world has the expected size (host updates that the
    schedule triggered at the epoch's start land within it)."""
    if state.epoch >= len(expected):
        return
    deadline = time.monotonic() + deadline_s
    while hvd.size() != expected[state.epoch]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"world size {hvd.size()} never became {expected[state.epoch]}")
        state.check_host_updates()
        time.sleep(0.02)


if __name__ == "__main__":
    main()
