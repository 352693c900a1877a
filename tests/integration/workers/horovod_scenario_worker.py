"""Worker script of the horovodrun scenario tests, in the shape of Horovod's own elastic test
script (written anew): a tiny model trained for a fixed number of batches per epoch, an exit
schedule, and one JSON line per epoch per rank.

- ``--exit-schedule '{"1,0": [0, 2]}'``: at epoch 1, batch 0, the processes whose *start
  rank* (``HOROVOD_RANK`` when ``init()`` returned) is 0 or 2 fail, by ``--exit-mode``
  (``exception``: an uncaught ``RuntimeError``; ``sigkill``: the process kills itself).
- Each rank appends ``{"ev": "epoch", "epoch", "batch", "commits", "rank", "size",
  "hostname", "start_rank", "rendezvous", "round", "pid", "time"}`` to its own file in
  ``--log-dir`` when it ends an epoch;
  ``rendezvous`` counts the entries into the elastic training function, kept in the state (so
  synced from rank 0), as Horovod's test counts them.
- ``--schedule``: the discovery schedule (``schedule_discovery.py``'s file). Rank 0 writes the
  epoch it starts to ``--epoch-file`` atomically (the discovery script reads it); when the
  schedule gives the next epoch other hosts, every rank waits at the end of the epoch until the
  host update interrupts it, so that each epoch runs on the hosts the schedule gives it.
  ``--await-update check`` (the default) has every rank check for host updates until one
  interrupts it; ``--await-update host-messages`` waits as Horovod's own test script does:
  rank 0 alone polls ``state._host_messages.empty()`` (Horovod's private queue of host-update
  notifications) before the epoch's last commit, which then interrupts every rank.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import torch

import elasticjob.worker_runtime as hvd
from elasticjob.script_env import ENV_HOROVOD_RANK
from elasticjob.worker_contract import ENV_HOROVOD_HOSTNAME, ENV_LOCAL_RANK


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batches-per-epoch", type=int, default=4)
    parser.add_argument("--batches-per-commit", type=int, default=1)
    parser.add_argument("--schedule", type=Path, help="discovery schedule: epoch -> hosts")
    parser.add_argument("--epoch-file", type=Path, help="rank 0 writes the epoch it starts here")
    parser.add_argument("--exit-schedule", default="{}", help='{"EPOCH,BATCH": [START_RANK...]}')
    parser.add_argument("--exit-mode", choices=["exception", "sigkill"], default="exception")
    parser.add_argument("--update-wait", type=float, default=60.0, help="seconds, at most")
    parser.add_argument("--await-update", choices=["check", "host-messages"], default="check")
    return parser.parse_args()


def hosts_of(schedule: dict[int, str], epoch: int) -> str:
    """The hosts the schedule gives ``epoch`` (an epoch without an entry keeps the last)."""
    return schedule[max(e for e in schedule if e <= epoch)]


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    hvd.init()
    hostname = os.environ[ENV_HOROVOD_HOSTNAME]
    start_rank = int(os.environ[ENV_HOROVOD_RANK])
    exits = {
        tuple(int(n) for n in key.split(",")): ranks
        for key, ranks in json.loads(args.exit_schedule).items()
    }
    schedule = (
        {int(k): v for k, v in json.loads(args.schedule.read_text()).items()}
        if args.schedule
        else {}
    )
    args.log_dir.mkdir(parents=True, exist_ok=True)
    log_file = args.log_dir / f"{hostname}-{os.environ[ENV_LOCAL_RANK]}-{os.getpid()}.jsonl"

    generator = torch.Generator().manual_seed(0)
    data, target = torch.randn(16, 2, generator=generator), torch.arange(16) % 2
    torch.manual_seed(1)
    model = torch.nn.Linear(2, 2)
    lr = 0.001
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr * hvd.size()))

    def on_reset() -> None:
        for group in optimizer.param_groups:
            group["lr"] = lr * hvd.size()

    def publish_epoch(epoch: int) -> None:
        if hvd.rank() != 0 or args.epoch_file is None:
            return
        partial = args.epoch_file.with_name(f"{args.epoch_file.name}.{os.getpid()}")
        partial.write_text(str(epoch))
        partial.replace(args.epoch_file)  # a reader never sees a half-written file

    def check_exit(epoch: int, batch: int) -> None:
        if start_rank not in exits.get((epoch, batch), []):
            return
        if args.exit_mode == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"scheduled exit at epoch {epoch} batch {batch} (rank {start_rank})")

    def await_host_update(state: hvd.elastic.TorchState) -> None:
        """Check for host updates (an agreed collective) until one interrupts every rank."""
        deadline = time.monotonic() + args.update_wait
        while time.monotonic() < deadline:
            state.check_host_updates()
            time.sleep(0.05)
        raise TimeoutError(f"no host update within {args.update_wait} s")

    def await_host_message(state: hvd.elastic.TorchState) -> None:
        """On rank 0, wait until a host update has reached this worker (Horovod's pattern)."""
        if hvd.rank() != 0:
            return
        deadline = time.monotonic() + args.update_wait
        state._last_updated_timestamp = 0
        while state._host_messages.empty():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no host update within {args.update_wait} s")
            time.sleep(0.05)

    state = hvd.elastic.TorchState(
        model=model, optimizer=optimizer, epoch=0, batch=0, commits=0, rendezvous=0
    )
    state.register_reset_callbacks([on_reset])

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        state.rendezvous += 1
        while state.epoch < args.epochs:
            publish_epoch(state.epoch)
            while state.batch < args.batches_per_epoch:
                check_exit(state.epoch, state.batch)
                optimizer.zero_grad()
                torch.autograd.backward(torch.nn.functional.cross_entropy(model(data), target))
                optimizer.step()
                state.batch += 1
                if state.batch % args.batches_per_commit == 0:
                    state.commits += 1
                    state.commit()
            line = {
                "ev": "epoch",
                "epoch": state.epoch,
                "batch": state.batch,
                "commits": state.commits,
                "rank": hvd.rank(),
                "size": hvd.size(),
                "hostname": hostname,
                "start_rank": start_rank,
                "rendezvous": state.rendezvous,
                "round": hvd.current_round(),
                "pid": os.getpid(),
                "time": time.time(),
            }
            with log_file.open("a") as out:
                out.write(json.dumps(line) + "\n")
            changes = bool(schedule) and state.epoch + 1 < args.epochs
            changes = changes and hosts_of(schedule, state.epoch + 1) != hosts_of(
                schedule, state.epoch
            )
            state.epoch += 1
            state.batch = 0
            state.commits += 1
            publish_epoch(state.epoch)
            if changes and args.await_update == "host-messages":
                await_host_message(state)
                state.commit()
                raise AssertionError("the commit after a host update did not interrupt")
            state.commit()
            if changes:
                await_host_update(state)

    train(state)
    hvd.shutdown()


if __name__ == "__main__":
    main()
