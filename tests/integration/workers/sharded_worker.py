"""Training script of the sharded-state tests: a small MLP sharded with FSDP2 over the round's
group, AdamW, gradient clipping across shards, an ``ElasticSampler``, and a
``hvd.elastic.ShardedState``; scripted failures and an event log per process.

For the tests only, rank 0 logs a digest of the whole state (gathered) at every commit and
whenever training resumes after a sync: the state a new round resumes from must be the last
commit, bit for bit. Weights are initialized from their global row index, so any world size
starts from the same model.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import select
import signal
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, TensorDataset

import elasticjob.worker_runtime as hvd
from elasticjob.worker_contract import ENV_HOSTNAME, ENV_LOCAL_RANK
from elasticjob.worker_runtime.elastic.sharded import shard_copies, sharded_state
from elasticjob.worker_runtime.rounds.host_updates import HostUpdateAgreement

FEATURES, HIDDEN, OUTPUTS = 8, 30, 3


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--commit-every", type=int, default=2)
    parser.add_argument("--redundancy", type=int, default=1)
    parser.add_argument("--hsdp", action="store_true", help="shard within a host, replicate across")
    parser.add_argument(
        "--shard-size", type=int, help="HSDP's shard size (default: a host's slots)"
    )
    parser.add_argument("--mixed-precision", action="store_true", help="bf16 compute, fp32 reduce")
    parser.add_argument("--epoch-file", type=Path, help="rank 0 writes the epoch it starts here")
    parser.add_argument("--expect-sizes", default="", help="world size each epoch must end with")
    parser.add_argument(
        "--hold-until-round", default="", help="EPOCH:ROUND: the epoch ends in round ROUND or later"
    )
    parser.add_argument("--fail", action="append", default=[], help="EPOCH:BATCH:RANK (SIGKILL)")
    parser.add_argument(
        "--freeze", default="", help="EPOCH:BATCH:RANK: stop as on a lost node (no reset)"
    )
    parser.add_argument(
        "--release-frozen", type=Path, help="a FIFO (made here): written to, --freeze ends"
    )
    parser.add_argument(
        "--suspend-at", default="", help="EPOCH:BATCH: rank 0 sends the launcher SIGUSR1, once"
    )
    parser.add_argument(
        "--fail-in-commit",
        default="",
        help="CALL:RANK:before|after: SIGKILL rank RANK at its CALL-th exchange of copies "
        "(the first is the first round's sync), before it starts or after it ended",
    )
    parser.add_argument(
        "--slow-copies", type=float, default=0.0, help="seconds each commit's copies wait"
    )
    parser.add_argument(
        "--leave-in-sync",
        default="",
        help="HOST:SLOTS: the processes of HOST, at their first sync, drop it from the "
        "discovery schedule, and SIGKILL themselves once told that it leaves",
    )
    return parser.parse_args()


class EventLog:
    def __init__(self, log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        host, slot = os.environ.get(ENV_HOSTNAME, "standalone"), os.environ.get(ENV_LOCAL_RANK)
        self._path = log_dir / f"{host}-{slot}-{os.getpid()}.jsonl"

    def write(self, event: str, **fields: Any) -> None:
        record = {"ev": event, "pid": os.getpid(), "time": time.time(), **fields}
        with self._path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def build(
    mesh: DeviceMesh, policy: MixedPrecisionPolicy
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    with torch.device("meta"):
        model = torch.nn.Sequential(
            torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUTPUTS)
        )
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    model.to_empty(device="cpu")
    shard_dim = mesh.ndim - 1  # HSDP's mesh: (replicate, shard)
    for param in model.parameters():
        assert isinstance(param, DTensor)
        local = param.to_local()
        start = mesh.get_local_rank(shard_dim) * -(-param.shape[0] // mesh.size(shard_dim))
        rows = torch.arange(start, start + local.shape[0], dtype=torch.float32)
        columns = torch.arange(local[0].numel() if local.shape[0] else 0, dtype=torch.float32)
        with torch.no_grad():
            grid = (rows[:, None] * 0.37 + columns[None, :] * 0.11).reshape(local.shape)
            local.copy_(torch.sin(grid) * 0.3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.01)
    return model, optimizer


def digest(state: hvd.elastic.ShardedState) -> str:
    """The whole state, gathered (for the tests only: a script never needs this)."""
    options = StateDictOptions(full_state_dict=True, flatten_optimizer_state_dict=True)
    model_state, optimizer_state = get_state_dict(state.model, state.optimizer, options=options)
    found = hashlib.sha256()
    for name, value in sorted({**model_state, **optimizer_state}.items()):
        found.update(name.encode())
        if isinstance(value, torch.Tensor):
            found.update(value.detach().contiguous().numpy().tobytes())
        else:
            found.update(repr(value).encode())
    return found.hexdigest()


def shard_digest(state: hvd.elastic.ShardedState) -> str:
    """This rank's own shards, parameters and optimizer state: the ranks holding one shard
    in the replicas of HSDP must hold it alike."""
    assert state.model is not None and state.optimizer is not None
    found = hashlib.sha256()
    for name, param in state.model.named_parameters():
        found.update(name.encode() + param.to_local().detach().contiguous().numpy().tobytes())
    for param_state in state.optimizer.state.values():
        for key, value in sorted(param_state.items()):
            local = value.to_local() if isinstance(value, DTensor) else value
            found.update(key.encode() + local.detach().contiguous().numpy().tobytes())
    return found.hexdigest()


def count_seen(
    state: hvd.elastic.ShardedState, idx: torch.Tensor, position: int, samples: int
) -> None:
    """Count the batch's samples (not the padding) as trained, over the whole world: the
    count is committed and rolled back with the state."""
    real = state.sampler.num_real_samples
    mask = torch.arange(position, position + len(idx)) < real
    counts = hvd.allreduce(torch.bincount(idx[mask], minlength=samples), op=hvd.Sum)
    state.seen = [a + int(b) for a, b in zip(state.seen, counts, strict=True)]


def log_commit(state: hvd.elastic.ShardedState, log: EventLog) -> None:
    """On rank 0, the digest of the state about to be committed (collective)."""
    committed = digest(state)
    if hvd.rank() == 0:
        log.write("commit", epoch=state.epoch, batch=state.batch, digest=committed,
                  round=hvd.current_round(), size=hvd.size())  # fmt: skip


def fail_in_commit(spec: str, log_dir: Path) -> None:
    """Make this rank SIGKILL itself inside a commit, around its exchange of copies."""
    call, rank, when = spec.split(":")
    exchange = shard_copies.exchange_copies
    calls = 0

    def exchange_and_die(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        dies = calls == int(call) and hvd.rank() == int(rank)
        marker = log_dir / f"fired-commit-{call}-{rank}"
        if dies and when == "before" and not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        copies = exchange(*args, **kwargs)
        if dies and when == "after" and not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return copies

    shard_copies.exchange_copies = exchange_and_die  # type: ignore[assignment]


def slow_copies(seconds: float) -> None:
    """Make every exchange of copies (on the commit's own thread) but the first round's sync's
    start ``seconds`` late."""
    exchange = shard_copies.exchange_copies
    calls = 0

    def slow_exchange(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls > 1:
            time.sleep(seconds)
        return exchange(*args, **kwargs)

    shard_copies.exchange_copies = slow_exchange  # type: ignore[assignment]


FROZEN_AT_MOST_S = 90.0


def freeze_as_a_lost_node(release: Path) -> None:
    """Stop as a process on a lost node does: every thread stops, and when the launcher kills
    it no reset reaches its peers (a child of another session holds its sockets open until
    something is written to the FIFO ``release``, or for at most ``FROZEN_AT_MOST_S``)."""
    os.mkfifo(release)
    if os.fork() == 0:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for stdio in (0, 1, 2):  # the launcher reads the worker's output to its end
            os.dup2(null, stdio)
        fd = os.open(release, os.O_RDONLY | os.O_NONBLOCK)
        select.select([fd], [], [], FROZEN_AT_MOST_S)
        os._exit(0)
    os.kill(os.getpid(), signal.SIGSTOP)


def leave_in_sync(host: str, schedule_file: Path) -> None:
    """On ``host`` (``HOST:SLOTS``): at the first sync, as the round's device mesh is about to
    be made, drop the host from the discovery schedule, wait until the notice that it leaves
    arrives, and SIGKILL this process before the round releases it: a pod deleted with a
    grace period too short to reach the next check, while the others form the mesh's groups."""
    if os.environ.get(ENV_HOSTNAME) != host.split(":", maxsplit=1)[0]:
        return
    told = threading.Event()
    saw_notice = HostUpdateAgreement.saw_notice

    def saw_notice_and_tell(self: HostUpdateAgreement, seq: int, *, suspend: bool = False) -> None:
        saw_notice(self, seq, suspend=suspend)
        told.set()

    def leave(*args: Any, **kwargs: Any) -> DeviceMesh:
        told.clear()
        schedule = json.loads(schedule_file.read_text())
        dropped = {
            epoch: ",".join(h for h in hosts.split(",") if h != host)
            for epoch, hosts in schedule.items()
        }
        partial = schedule_file.with_name(f"{schedule_file.name}.{os.getpid()}")
        partial.write_text(json.dumps(dropped))
        partial.replace(schedule_file)
        if not told.wait(60):
            raise RuntimeError("never told to leave")
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")

    HostUpdateAgreement.saw_notice = saw_notice_and_tell  # type: ignore[method-assign]
    sharded_state.DeviceMesh = leave  # type: ignore[attr-defined, assignment]


def main() -> None:
    args = parse_args()
    log = EventLog(args.log_dir)
    torch.set_num_threads(1)
    hvd.init()
    if args.fail_in_commit:
        fail_in_commit(args.fail_in_commit, args.log_dir)
    if args.slow_copies:
        slow_copies(args.slow_copies)
    if args.leave_in_sync:
        assert args.epoch_file is not None, "--leave-in-sync needs a discovery schedule"
        leave_in_sync(args.leave_in_sync, args.epoch_file.with_name("schedule.json"))
    expected = [int(s) for s in args.expect_sizes.split(",") if s]
    held = dict([map(int, args.hold_until_round.split(":"))]) if args.hold_until_round else {}

    def may_end(epoch: int) -> bool:
        """Whether the epoch may end: in the world size expected, in the round awaited."""
        sized = epoch >= len(expected) or hvd.size() == expected[epoch]
        return sized and hvd.current_round() >= held.get(epoch, 0)

    generator = torch.Generator().manual_seed(0)
    features = torch.randn(args.samples, FEATURES, generator=generator)
    targets = torch.randn(args.samples, OUTPUTS, generator=generator)
    dataset = TensorDataset(features, targets, torch.arange(args.samples))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=7)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if args.mixed_precision
        else MixedPrecisionPolicy()
    )
    state = hvd.elastic.ShardedState(
        functools.partial(build, policy=policy),
        redundancy=args.redundancy,
        hsdp=args.hsdp,
        shard_size=args.shard_size,
        sampler=sampler,
        epoch=0,
        batch=0,
        seen=[0] * args.samples,
    )

    @hvd.elastic.run
    def train(state: hvd.elastic.ShardedState) -> None:
        resumed = digest(state)
        if hvd.rank() == 0:
            assert state.last_sync is not None
            log.write("resumed", epoch=state.epoch, batch=state.batch, digest=resumed,
                      round=hvd.current_round(), size=hvd.size(),
                      sent_bytes=state.last_sync.sent_bytes,
                      kept=state.last_sync.kept)  # fmt: skip
        while state.epoch < args.epochs:
            if hvd.rank() == 0 and args.epoch_file is not None:
                partial = args.epoch_file.with_name(f"{args.epoch_file.name}.{os.getpid()}")
                partial.write_text(str(state.epoch))
                partial.replace(args.epoch_file)
            for batch_idx, (x, y, idx) in enumerate(loader):
                if f"{state.epoch}:{state.batch}:{hvd.rank()}" in args.fail:
                    marker = args.log_dir / f"fired-{state.epoch}-{state.batch}-{hvd.rank()}"
                    if not marker.exists():
                        marker.touch()
                        state.wait_for_commit()  # the survivors resume from the last one
                        os.kill(os.getpid(), signal.SIGKILL)
                if f"{state.epoch}:{state.batch}:{hvd.rank()}" == args.freeze:
                    marker = args.log_dir / "fired-freeze"
                    if not marker.exists():
                        marker.touch()
                        state.wait_for_commit()
                        log.write("freeze", epoch=state.epoch, batch=state.batch)
                        freeze_as_a_lost_node(args.release_frozen)
                if hvd.rank() == 0 and args.suspend_at == f"{state.epoch}:{state.batch}":
                    marker = args.log_dir / "fired-suspend"
                    if not marker.exists():
                        marker.touch()
                        os.kill(os.getppid(), signal.SIGUSR1)  # training goes on until told
                assert state.model is not None and state.optimizer is not None
                loss = torch.nn.functional.mse_loss(state.model(x), y)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(state.model.parameters(), 1.0)
                state.optimizer.step()
                state.optimizer.zero_grad()
                count_seen(state, idx, batch_idx * args.batch_size, args.samples)
                state.sampler.record_batch(batch_idx, args.batch_size)
                state.batch += 1
                if state.batch % args.commit_every == 0:
                    log_commit(state, log)
                    started = time.monotonic()
                    state.commit()
                    if hvd.rank() == 0:  # the previous commit's copies were settled in it
                        log.write("committed", returned_s=time.monotonic() - started,
                                  previous_copies_s=state.copy_seconds)  # fmt: skip
            deadline = time.monotonic() + 90
            while not may_end(state.epoch):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"world size {hvd.size()} never became {expected}, or round "
                        f"{hvd.current_round()} never {args.hold_until_round}"
                    )
                try:
                    state.check_host_updates()
                except hvd.HostsUpdatedInterrupt:
                    log_commit(state, log)  # what the interrupt committed: the live state
                    raise
                time.sleep(0.02)
            state.epoch += 1
            state.batch = 0
            state.sampler.set_epoch(state.epoch)
            log_commit(state, log)
            state.commit()

    train(state)
    final = digest(state)
    layout = state.layout
    assert layout is not None
    log.write("done", rank=hvd.rank(), size=hvd.size(), round=hvd.current_round(), digest=final,
              seen_min=min(state.seen), seen_max=max(state.seen), replicas=layout.replicas,
              shard=layout.shard_of(hvd.rank()), shard_digest=shard_digest(state))  # fmt: skip
    hvd.shutdown()


if __name__ == "__main__":
    main()
