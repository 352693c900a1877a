"""The ``elasticjob`` command: submit a script as a job and follow it (``submit``, ``status``,
``logs``, ``delete``: ``elasticjob/submit/commands.py``), draw a job's ``timeline``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from elasticjob.driver.job_record import JobRecordData
from elasticjob.job_timeline import PlotUnavailableError, render
from elasticjob.submit.commands import add_commands, run, split_script_args


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="elasticjob", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    timeline = commands.add_parser(
        "timeline",
        help="draw a job's timeline: world size and throughput over time, its events, and "
        "where the time went",
    )
    timeline.add_argument(
        "source",
        help="a job record file (elasticjob-run --job-record), or the name of an ElasticJob "
        "(its record is read from the cluster)",
    )
    timeline.add_argument(
        "-o", "--output", type=Path, help="out.png or out.html (default: <job>-timeline.png)"
    )
    timeline.add_argument(
        "-n", "--namespace", help="the ElasticJob's namespace (default: the kubeconfig's)"
    )
    add_commands(commands)
    return parser


def _read(source: str, namespace: str | None) -> JobRecordData:
    path = Path(source)
    if path.is_file():
        return JobRecordData.model_validate_json(path.read_bytes())
    from elasticjob.operator.job_records import read_from_cluster  # noqa: PLC0415 (kubernetes)

    return read_from_cluster(source, namespace)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns its exit code."""
    own, script_args = split_script_args(list(sys.argv[1:] if argv is None else argv))
    args = _parser().parse_args(own)
    args.script_args = script_args
    if args.command == "timeline":
        return _timeline(args)
    return run(args)


def _timeline(args: argparse.Namespace) -> int:
    try:
        record = _read(args.source, args.namespace)
    except (OSError, ValidationError, LookupError) as exc:
        print(f"elasticjob timeline: cannot read {args.source!r}: {exc}", file=sys.stderr)
        return 1
    out = args.output or Path(f"{record.job}-timeline.png")
    try:
        render(record, out)
    except (PlotUnavailableError, ValueError, OSError) as exc:
        print(f"elasticjob timeline: {exc}", file=sys.stderr)
        return 1
    print(f"timeline of {record.job} written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
