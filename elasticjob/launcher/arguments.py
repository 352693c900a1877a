"""``elasticjob-run``'s command line: horovodrun's flags that apply here (those that cannot
apply are refused by name) and their checks (a bad argument is a usage error naming it, never
a traceback). What the checked arguments mean for the driver: ``job_settings.py``.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from elasticjob.checkpoint_policy import DEFAULT_KEEP, CheckpointPolicy
from elasticjob.driver.discovery import MAX_SLOTS_PER_HOST, parse_hosts
from elasticjob.driver.driver_types import (
    DEFAULT_MAX_FAILED_ROUNDS_WITHOUT_COMMIT,
    DEFAULT_MAX_RESTARTS,
    DEFAULT_START_TIMEOUT_S,
    DiscoveryError,
    DriverSettings,
    JobMode,
)
from elasticjob.driver.liveness import DEFAULT_HEARTBEAT_TIMEOUT_S
from elasticjob.launcher.horovodrun_flags import (
    LOG_LEVELS,
    HostfileError,
    NetworkInterfaces,
    add_refused_flags,
    parse_hostfile,
)
from elasticjob.launcher.job_settings import fixed_hosts, min_np
from elasticjob.launcher.warm_workers import START_SERVER_ENV
from elasticjob.wire.messages import JobName


def build_parser() -> argparse.ArgumentParser:
    """horovodrun's flags that apply here, in its spellings; those that cannot apply are
    refused by name (:mod:`elasticjob.launcher.horovodrun_flags`)."""
    parser = argparse.ArgumentParser(
        prog="elasticjob-run",
        description="Run an elastic PyTorch job on this machine (horovodrun's flags).",
        # No abbreviations: the command's own flags (``train.py --checkpoint x``) would be
        # taken for ambiguous abbreviations of ours and refused.
        allow_abbrev=False,
    )
    parser.add_argument("-v", "--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument(
        "-np",
        "--num-proc",
        type=int,
        dest="np",
        help="number of processes; in elastic mode, the number needed before training starts",
    )
    parser.add_argument(
        "--min-np",
        "--min-num-proc",
        type=int,
        dest="min_np",
        help="fewest processes to train with (default: -np)",
    )
    parser.add_argument(
        "--max-np",
        "--max-num-proc",
        type=int,
        dest="max_np",
        help="most processes; unbounded by default in elastic mode (--min-np or a discovery "
        "script given), else -np",
    )
    hosts = parser.add_mutually_exclusive_group()
    hosts.add_argument("-H", "--hosts", help="fixed hosts: host1:slots,host2:slots,...")
    hosts.add_argument(
        "-hostfile", "--hostfile", help="file of fixed hosts, one '<host> slots=<N>' per line"
    )
    hosts.add_argument("--host-discovery-script", help="executable printing host[:slots] lines")
    parser.add_argument(
        "--slots",
        "--slots-per-host",
        type=int,
        default=1,
        dest="slots",
        help="slots of a host given without slots (default 1)",
    )
    parser.add_argument("--reset-limit", type=int, help="fail after this many resets")
    parser.add_argument(
        "--mode",
        choices=[m.value for m in JobMode],
        default=JobMode.ELASTIC.value,
        help="elastic: the script uses the elastic API and keeps its processes and state "
        "across changes; restart: a torchrun script, run unchanged, stopped and started again "
        "with its new rank at every change (default elastic)",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        metavar="N",
        help="fail after N restarts that follow a failure (torchrun's --max-restarts; "
        f"default {DEFAULT_MAX_RESTARTS} in restart mode, else unlimited)",
    )
    parser.add_argument(
        "--max-failed-rounds-without-commit",
        type=int,
        metavar="N",
        default=DEFAULT_MAX_FAILED_ROUNDS_WITHOUT_COMMIT,
        help="elastic mode: fail once N rounds in a row failed with no new commit between "
        "them, a script that is broken rather than unlucky (default "
        f"{DEFAULT_MAX_FAILED_ROUNDS_WITHOUT_COMMIT}; 0: never)",
    )
    parser.add_argument(
        "--no-warm-start",
        dest="warm_start",
        action="store_false",
        help="start every worker in a fresh interpreter (by default a worker command "
        "`python SCRIPT` or `python -m MODULE` is forked from an interpreter with torch "
        "imported; in restart mode, each agent's script)",
    )
    parser.add_argument(
        "--start-server",
        metavar="SOCKET",
        default=os.environ.get(START_SERVER_ENV) or None,
        help="fork the workers from the shared start server listening at SOCKET "
        "(`elasticjob-run --serve-starts SOCKET`), where it runs the command's interpreter in the "
        "job's environment; otherwise the job starts a server of its own "
        f"(default: ${START_SERVER_ENV})",
    )
    parser.add_argument(
        "--serve-starts",
        metavar="SOCKET",
        help="run a shared start server at SOCKET in the foreground, for the jobs of "
        "`elasticjob-run --start-server SOCKET` that follow (with the interpreter given as "
        "the command, else this one; in this environment); it imports torch once for them all",
    )
    parser.add_argument(
        "--elastic-timeout",
        type=float,
        default=os.environ.get("HOROVOD_ELASTIC_TIMEOUT", "600"),
        help="seconds to wait while fewer than --min-np slots are available "
        "(default: $HOROVOD_ELASTIC_TIMEOUT, else 600)",
    )
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=os.environ.get("HOROVOD_START_TIMEOUT", f"{DEFAULT_START_TIMEOUT_S:g}"),
        help="seconds a new worker may take to register "
        f"(default: $HOROVOD_START_TIMEOUT, else {DEFAULT_START_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--removal-grace",
        type=float,
        default=DriverSettings.removal_grace_s,
        metavar="SECONDS",
        help="how long a worker on its way out (dismissed, or done and tearing down) may "
        "take to exit before it is stopped (default %(default)g)",
    )
    parser.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=DEFAULT_HEARTBEAT_TIMEOUT_S,
        metavar="SECONDS",
        help="kill a worker process (and blacklist its host) that sent no heartbeat "
        f"for this long; 0 turns it off (default {DEFAULT_HEARTBEAT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--blacklist-cooldown-range",
        type=float,
        nargs=2,
        metavar=("MIN", "MAX"),
        default=(10.0, 300.0),
        help="cooldown of a failed host, in seconds",
    )
    for flag in ("--network-interfaces", "--network-interface"):
        parser.add_argument(
            flag,
            action=NetworkInterfaces,
            dest="nics",
            help="interfaces for Gloo/NCCL traffic, comma-separated (e.g. lo); repeatable",
        )
    parser.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    parser.add_argument(
        "--gloo",
        action="store_true",
        help="horovodrun's Gloo controller: accepted, it is the only one (Gloo runs the "
        "collectives on CPU; --backend picks NCCL for GPUs)",
    )
    parser.add_argument(
        "--output-filename",
        metavar="DIR",
        help="also write each rank's output to DIR/rank.<rank>/stdout and .../stderr",
    )
    parser.add_argument(
        "--timeline-filename",
        metavar="FILE",
        help="write a Chrome-trace JSON (chrome://tracing, Perfetto) of every worker's "
        "rounds, resets, commits and collectives to FILE at the end of the job",
    )
    parser.add_argument(
        "--job-record",
        metavar="FILE",
        help="keep the job's record (world size, throughput, rounds, failures, blacklisting, "
        "goodput over time) in FILE, for `elasticjob timeline FILE`",
    )
    checkpoints = parser.add_argument_group(
        "durable checkpoints",
        "rank 0 writes the committed state to DIR, off the training thread (a ShardedState: "
        "every rank its shards, in torch.distributed.checkpoint format); when no worker of a "
        "round survives, fresh workers start from the newest complete one",
    )
    checkpoints.add_argument("--checkpoint-dir", metavar="DIR", help="folder of the checkpoints")
    checkpoints.add_argument(
        "--checkpoint-every-commits",
        type=int,
        metavar="N",
        help="write a checkpoint every N commits",
    )
    checkpoints.add_argument(
        "--checkpoint-interval",
        type=float,
        metavar="SECONDS",
        help="or: write one at the first commit SECONDS after the previous one",
    )
    checkpoints.add_argument(
        "--checkpoint-keep",
        type=int,
        metavar="K",
        default=DEFAULT_KEEP,
        help=f"keep the newest K complete checkpoints (default {DEFAULT_KEEP})",
    )
    parser.add_argument("--job-name", default="local", help="name of the job (default: local)")
    parser.add_argument("--verbose", action="store_true", help="debug logging of the driver")
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        help="least level the launcher logs to stderr (default: INFO, DEBUG with --verbose)",
    )
    add_refused_flags(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the worker command")
    return parser


def _version() -> str:
    try:
        return metadata.version("elasticjob")
    except metadata.PackageNotFoundError:
        return "unknown"


_JOB_NAME: TypeAdapter[str] = TypeAdapter(JobName)


def _finite(value: float, *, positive: bool = False) -> bool:
    return math.isfinite(value) and (value > 0 if positive else value >= 0)


def _argument_errors(args: argparse.Namespace) -> Iterator[str]:
    """What is wrong with the arguments, one message per problem."""
    for flag, value in (("-np", args.np), ("--min-np", args.min_np), ("--max-np", args.max_np)):
        if value is not None and value < 1:
            yield f"{flag} must be >= 1, got {value}"
    if args.max_np is not None and min_np(args) > args.max_np:
        flag = "--min-np" if args.min_np is not None else "-np (the default --min-np)"
        yield f"{flag} ({min_np(args)}) must not exceed --max-np ({args.max_np})"
    if not 1 <= args.slots <= MAX_SLOTS_PER_HOST:
        yield f"--slots must be from 1 to {MAX_SLOTS_PER_HOST}, got {args.slots}"
    if args.max_restarts is not None and args.max_restarts < 0:
        yield f"--max-restarts must be >= 0, got {args.max_restarts}"
    if args.reset_limit is not None and args.reset_limit < 0:
        yield f"--reset-limit must be >= 0, got {args.reset_limit}"
    if args.max_failed_rounds_without_commit < 0:
        yield (
            "--max-failed-rounds-without-commit must be >= 0, "
            f"got {args.max_failed_rounds_without_commit}"
        )
    if not _finite(args.elastic_timeout):
        yield f"--elastic-timeout must be >= 0 seconds, got {args.elastic_timeout}"
    if not _finite(args.start_timeout, positive=True):
        yield f"--start-timeout must be > 0 seconds, got {args.start_timeout}"
    if not _finite(args.removal_grace, positive=True):
        yield f"--removal-grace must be > 0 seconds, got {args.removal_grace}"
    if not _finite(args.heartbeat_timeout):
        yield f"--heartbeat-timeout must be >= 0 seconds, got {args.heartbeat_timeout}"
    low, high = args.blacklist_cooldown_range
    if not (_finite(low, positive=True) and _finite(high) and low <= high):
        yield f"--blacklist-cooldown-range must be 0 < MIN <= MAX seconds, got {low:g} {high:g}"
    try:
        _JOB_NAME.validate_python(args.job_name)
    except ValidationError:
        yield (
            f"--job-name {args.job_name!r} is not a valid job name (lower-case letters, digits, "
            "'-' and '.', starting and ending with a letter or digit, at most 253 characters)"
        )
    if args.timeline_filename and not Path(args.timeline_filename).resolve().parent.is_dir():
        yield f"--timeline-filename {args.timeline_filename!r}: its folder does not exist"
    if args.job_record and not Path(args.job_record).resolve().parent.is_dir():
        yield f"--job-record {args.job_record!r}: its folder does not exist"
    yield from _checkpoint_errors(args)
    if not args.command:
        yield "no worker command given (e.g. elasticjob-run -np 2 python train.py)"


def _checkpoint_errors(args: argparse.Namespace) -> Iterator[str]:
    every, interval = args.checkpoint_every_commits, args.checkpoint_interval
    if not args.checkpoint_dir:
        if every is not None or interval is not None:
            yield "--checkpoint-every-commits and --checkpoint-interval need --checkpoint-dir"
        return
    if Path(args.checkpoint_dir).exists() and not Path(args.checkpoint_dir).is_dir():
        yield f"--checkpoint-dir {args.checkpoint_dir!r} is not a folder"
    if (every is None) == (interval is None):
        yield (
            "--checkpoint-dir needs exactly one of --checkpoint-every-commits N and "
            "--checkpoint-interval SECONDS"
        )
    if every is not None and every < 1:
        yield f"--checkpoint-every-commits must be >= 1, got {every}"
    if interval is not None and not _finite(interval, positive=True):
        yield f"--checkpoint-interval must be > 0 seconds, got {interval}"
    if args.checkpoint_keep < 1:
        yield f"--checkpoint-keep must be >= 1, got {args.checkpoint_keep}"


def checkpoint_policy(args: argparse.Namespace) -> CheckpointPolicy | None:
    """The job's checkpoint policy from checked arguments (None: no ``--checkpoint-dir``)."""
    if not args.checkpoint_dir:
        return None
    return CheckpointPolicy(
        folder=str(Path(args.checkpoint_dir).resolve()),
        every_commits=args.checkpoint_every_commits or 0,
        interval_s=args.checkpoint_interval or 0.0,
        keep=args.checkpoint_keep,
    )


def parse_arguments(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None
) -> argparse.Namespace:
    """Parse and check the arguments; a bad one is a usage error (``parser.error``: the
    usage, the problem, exit status 2), never a traceback."""
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if args.serve_starts:
        if len(args.command) > 1:
            parser.error("--serve-starts takes an interpreter as its command, nothing more")
        return args
    for problem in _argument_errors(args):
        parser.error(problem)
    if args.hostfile:
        try:
            args.hosts = parse_hostfile(args.hostfile, args.slots)
        except HostfileError as exc:
            parser.error(f"--hostfile: {exc}")
    if args.host_discovery_script:
        return args
    flag = "--hostfile" if args.hostfile else "-H"
    try:
        fixed = parse_hosts(fixed_hosts(args), args.slots)
    except DiscoveryError as exc:
        parser.error(f"{flag}: {exc}")
    needed = min_np(args)
    if sum(fixed.values()) < needed:
        parser.error(
            f"the fixed hosts offer {sum(fixed.values())} slots ({fixed_hosts(args)}), "
            f"fewer than the {needed} processes the job needs at least (--min-np, or -np): "
            "they can never be enough"
        )
    return args
