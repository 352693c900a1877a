"""The ``elasticjob submit``, ``status``, ``logs`` and ``delete`` commands (their options, and
what each prints); ``elasticjob/cli.py`` adds them to the ``elasticjob`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.config import ConfigException

from elasticjob.driver.driver_types import JobMode
from elasticjob.operator.kube_errors import api_message
from elasticjob.submit import (
    BundleError,
    JobClient,
    JobNotFoundError,
    RequestError,
    SubmittedJob,
    build,
)
from elasticjob.submit.follow import follow, phase_condition, rank_pod
from elasticjob.submit.job_request import DEFAULT_IMAGE

_EXAMPLE = """example:
  elasticjob submit train.py --workers 2:4 --follow -- --epochs 5
  elasticjob submit ./src --entry train.py --gpus 1 --image registry.example.com/me/train:1"""


def add_commands(commands: Any) -> None:
    """Add the commands to ``commands`` (an argparse sub-parsers action)."""
    submit = commands.add_parser(
        "submit",
        help="run a local script (or a small folder) on the cluster as an ElasticJob",
        epilog=_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    submit.add_argument(
        "path",
        help="the script, or a folder holding it (see --entry); the script's own "
        "arguments follow a --",
    )
    submit.add_argument("--entry", help="the script to run in the folder (default: train.py)")
    submit.add_argument("--name", help="the job's name (default: the script's, made unique)")
    submit.add_argument(
        "--workers", default="1", help="worker pods: N, or MIN:MAX (starts with MAX; default 1)"
    )
    submit.add_argument("--image", default=DEFAULT_IMAGE, help=f"default: {DEFAULT_IMAGE}")
    submit.add_argument(
        "--mode",
        choices=[m.value for m in JobMode],
        default=JobMode.ELASTIC.value,
        help="elastic: the script uses the elastic API (default); restart: an unchanged "
        "torchrun script, restarted with its new rank on every change",
    )
    submit.add_argument("--gpus", type=int, default=0, help="GPUs per worker pod, one process each")
    submit.add_argument("--cpu", help="CPU each worker pod requests (e.g. 2, 500m)")
    submit.add_argument("--memory", help="memory each worker pod requests and is limited to")
    submit.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="(repeatable)"
    )
    submit.add_argument(
        "--follow", action="store_true", help="print rank 0's log and the job's rounds to its end"
    )
    submit.add_argument(
        "--dry-run", action="store_true", help="print the manifests instead of creating them"
    )
    submit.set_defaults(run=_submit)

    status = commands.add_parser("status", help="an ElasticJob's phase, round, workers, story")
    status.add_argument("name")
    status.set_defaults(run=_status)

    logs = commands.add_parser("logs", help="the log of the pod that holds a rank (default 0)")
    logs.add_argument("name")
    logs.add_argument("--rank", type=int, default=0)
    logs.add_argument(
        "-f", "--follow", action="store_true", help="and the job's story, to the job's end"
    )
    logs.set_defaults(run=_logs)

    delete = commands.add_parser("delete", help="delete an ElasticJob, its pods and its code")
    delete.add_argument("name")
    delete.set_defaults(run=_delete)

    for parser in (submit, status, logs, delete):
        parser.add_argument("-n", "--namespace", help="default: the kubeconfig context's")
        parser.add_argument("--kubeconfig", help="default: $KUBECONFIG or ~/.kube/config")
        parser.add_argument("--context", help="the kubeconfig context (default: its current)")


def split_script_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """The command's own arguments, and the script's (those after the first ``--``)."""
    if "--" not in argv:
        return argv, []
    at = argv.index("--")
    return argv[:at], argv[at + 1 :]


def run(args: argparse.Namespace) -> int:
    """Run the command ``args`` name; its exit code. Errors are printed, not raised."""
    try:
        code: int = args.run(args)
    except (BundleError, RequestError, JobNotFoundError, ConfigException) as exc:
        print(f"elasticjob {args.command}: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, BundleError | RequestError) else 1
    except ApiException as exc:
        message = f"{exc.status} {exc.reason}: {api_message(exc)}"
        print(f"elasticjob {args.command}: {message}", file=sys.stderr)
        return 1
    return code


def _client(args: argparse.Namespace) -> JobClient:
    return JobClient.connect(args.kubeconfig, args.context, args.namespace)


def _submit(args: argparse.Namespace) -> int:
    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise RequestError(f"--env: NAME=VALUE, got {item!r}")
        env[key] = value
    job, config_map = build(
        args.path,
        entry=args.entry,
        name=args.name,
        workers=args.workers,
        args=args.script_args,
        image=args.image,
        mode=args.mode,
        gpus=args.gpus,
        env=env,
        cpu=args.cpu,
        memory=args.memory,
    )
    if args.dry_run:
        import yaml  # noqa: PLC0415 (only here)

        print(yaml.safe_dump_all([config_map, job], sort_keys=False), end="")
        return 0
    client = _client(args)
    created = client.create(job, config_map)
    name = created["metadata"]["name"]
    print(f"elasticjob.dev/{name} created in namespace {client.namespace}")
    if args.follow:
        return follow(client, name)
    ns = f" -n {client.namespace}"
    print(f"  follow it:   elasticjob logs {name} -f{ns}")
    print(f"  its status:  elasticjob status {name}{ns}   (or kubectl describe ej {name}{ns})")
    print(f"  scale it:    kubectl scale ej/{name} --replicas=N{ns}")
    print(f"  delete it:   elasticjob delete {name}{ns}")
    return 0


def describe(job: Mapping[str, Any]) -> list[str]:
    """What ``elasticjob status`` prints of ``job``."""
    status = job.get("status") or {}
    spec = job.get("spec") or {}
    phase = status.get("phase") or "Pending"
    reason, message = phase_condition(status, phase)
    lines = [f"{job['metadata']['name']}: {phase}"]
    if message:
        lines[0] += f" ({reason}): {message}"
    lines.append(
        f"round {status.get('round', 0)}: {status.get('worldSize', 0)} workers; "
        f"{status.get('replicas', 0)} pods of {spec.get('replicas')} wanted "
        f"({spec.get('minReplicas', 1)} to {spec.get('maxReplicas')})"
    )
    progress = status.get("progress") or {}
    if progress:
        lines.append(
            f"epoch {progress.get('epoch', 0)}, step {progress.get('step', 0)}, "
            f"{progress.get('samplesPerSecond', 0.0):.1f} samples/s"
        )
    for worker in status.get("workers") or []:
        ranks = ",".join(str(r) for r in worker.get("ranks") or [])
        lines.append(f"  rank {ranks}: pod {worker['pod']} on {worker.get('node') or '?'}")
    lines.extend(f"  {line}" for line in (status.get("history") or [])[-10:])
    return lines


def _status(args: argparse.Namespace) -> int:
    for line in describe(_client(args).read(args.name)):
        print(line)
    return 0


def _logs(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.follow:
        return follow(client, args.name, rank=args.rank)
    pod = rank_pod(client.read(args.name).get("status") or {}, args.rank)
    if pod is None:
        raise JobNotFoundError(f"no pod of {args.name} holds rank {args.rank} now")
    lines, _ = client.log_lines(pod, follow=False)
    for line in lines:
        print(line)
    return 0


def _delete(args: argparse.Namespace) -> int:
    SubmittedJob(_client(args), args.name).delete()
    print(f"elasticjob.dev/{args.name} deleted")
    return 0
