"""horovodrun's spellings that ``elasticjob-run`` takes, and those it refuses.

horovodrun (``horovod/runner/launch.py``) has flags that cannot apply to this launcher: MPI,
jsrun and SSH options: each of them is refused with a usage error that names it and says
why. The tuning knobs of Horovod's C++ background thread (there is none here: collectives are
``torch.distributed``'s) and the output timestamps change no result: a command line that
gives them runs, with a warning naming each. None is silently ignored.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL")
"""horovodrun's ``--log-level`` choices."""

_PYTHON_LEVELS = {
    "TRACE": logging.DEBUG,
    "DEBUG": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
    "FATAL": logging.CRITICAL,
}

_MPI = "elasticjob-run has no MPI: workers always use torch.distributed (Gloo on CPU, NCCL on GPU)"
_SSH = "elasticjob-run starts every worker on this machine, without SSH"
_CORE = (
    "it tunes Horovod's C++ background thread, which elasticjob does not have "
    "(collectives are torch.distributed's)"
)
_TIMESTAMPS = "elasticjob-run prefixes output lines with the rank only"

REFUSED: dict[tuple[str, ...], str] = {
    ("--mpi",): _MPI,
    ("--jsrun",): _MPI,
    ("--mpi-args",): _MPI,
    ("--mpi-threads-disable",): _MPI,
    ("--no-mpi-threads-disable",): _MPI,
    ("--tcp",): _MPI,
    ("--binding-args",): _MPI,
    ("-p", "--ssh-port"): _SSH,
    ("-i", "--ssh-identity-file"): _SSH,
    ("--disable-cache",): "elasticjob-run runs no per-host checks, so it has nothing to cache",
    ("-cb", "--check-build"): "elasticjob has no build options to show (it is pure Python)",
    ("--config-file",): "elasticjob-run reads no YAML configuration: give the flags instead",
}
"""Every horovodrun flag that cannot apply here, with the reason: a usage error, since
each changes how or where the job runs."""

IGNORED: dict[tuple[str, ...], tuple[int, str]] = {
    ("--fusion-threshold-mb",): (1, _CORE),
    ("--cycle-time-ms",): (1, _CORE),
    ("--cache-capacity",): (1, _CORE),
    ("--hierarchical-allreduce",): (0, _CORE),
    ("--no-hierarchical-allreduce",): (0, _CORE),
    ("--hierarchical-allgather",): (0, _CORE),
    ("--no-hierarchical-allgather",): (0, _CORE),
    ("--torus-allreduce",): (0, _CORE),
    ("--no-torus-allreduce",): (0, _CORE),
    ("--autotune",): (0, _CORE),
    ("--no-autotune",): (0, _CORE),
    ("--autotune-log-file",): (1, _CORE),
    ("--autotune-warmup-samples",): (1, _CORE),
    ("--autotune-steps-per-sample",): (1, _CORE),
    ("--autotune-bayes-opt-max-samples",): (1, _CORE),
    ("--autotune-gaussian-process-noise",): (1, _CORE),
    ("--timeline-mark-cycles",): (0, _CORE),
    ("--no-timeline-mark-cycles",): (0, _CORE),
    ("--stall-check",): (0, _CORE),
    ("--no-stall-check",): (0, _CORE),
    ("--stall-check-warning-time-seconds",): (1, _CORE),
    ("--stall-check-shutdown-time-seconds",): (1, _CORE),
    ("--num-nccl-streams",): (1, _CORE),
    ("--thread-affinity",): (1, _CORE),
    ("--gloo-timeout-seconds",): (
        1,
        "collectives here abort when the round breaks; their timeout is torch.distributed's",
    ),
    ("--log-with-timestamp",): (0, _TIMESTAMPS),
    ("--log-without-timestamp",): (0, _TIMESTAMPS),
    ("--log-hide-timestamp",): (0, _TIMESTAMPS),
    ("--no-log-hide-timestamp",): (0, _TIMESTAMPS),
    ("-prefix-timestamp", "--prefix-output-with-timestamp"): (0, _TIMESTAMPS),
}
"""horovodrun's tuning and output-format flags, by name: how many values each takes and why it
has no effect here. A command line that gives one still runs (they change no result), with a
warning on stderr naming the flag."""


class _Unsupported(argparse.Action):
    """A horovodrun flag that does nothing here: with ``refuse``, it fails the parse at once;
    otherwise it takes its values and warns on stderr. Either way it names the flag and says
    why (the argument's ``help``)."""

    def __init__(
        self, option_strings: Sequence[str], dest: str, *, refuse: bool, **kwargs: Any
    ) -> None:
        self.reason = str(kwargs.pop("help"))
        self.refuse = refuse
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        if self.refuse:
            parser.error(
                f"horovodrun's {option_string} does not apply to elasticjob-run: {self.reason}"
            )
        print(
            f"{parser.prog}: warning: horovodrun's {option_string} has no effect here and is "
            f"ignored: {self.reason}",
            file=sys.stderr,
        )


def add_refused_flags(parser: argparse.ArgumentParser) -> None:
    """Make every flag of :data:`REFUSED` a usage error naming it, and every flag of
    :data:`IGNORED` a warning naming it."""
    for names, reason in REFUSED.items():
        parser.add_argument(
            *names, action=_Unsupported, refuse=True, nargs="?", dest="refused", help=reason
        )
    for names, (values, reason) in IGNORED.items():
        parser.add_argument(
            *names, action=_Unsupported, refuse=False, nargs=values, dest="ignored", help=reason
        )


class NetworkInterfaces(argparse.Action):
    """``--network-interfaces eth0,eth1`` or ``--network-interface eth0`` (repeatable), as
    horovodrun takes them: every use adds to one list."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        current = list(getattr(namespace, self.dest) or [])
        for name in str(values).split(","):
            if not name.strip():
                parser.error(f"{option_string} {values!r}: an interface name is empty")
            if name.strip() not in current:
                current.append(name.strip())
        setattr(namespace, self.dest, current)


def python_log_level(level: str) -> int:
    """The :mod:`logging` level of a horovodrun ``--log-level`` (TRACE is DEBUG, FATAL is
    CRITICAL)."""
    return _PYTHON_LEVELS[level]


class HostfileError(ValueError):
    """A hostfile that cannot be read or has a bad line (the message names it)."""


def parse_hostfile(path: str | Path, default_slots: int) -> str:
    """The ``host:slots,...`` list of a horovodrun hostfile: one ``<host> slots=<N>`` per
    line (``slots=`` may be left out: ``default_slots``); blank lines and ``#`` comments are
    skipped. Raises :class:`HostfileError` naming the file and line of a problem."""
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise HostfileError(f"hostfile {str(path)!r} cannot be read: {exc}") from exc
    hosts = []
    for number, raw in enumerate(lines, start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        host, *rest = line.split()
        slots = str(default_slots)
        if rest:
            key, _, value = rest[0].partition("=")
            if len(rest) > 1 or key != "slots" or not value.isdigit() or int(value) < 1:
                raise HostfileError(
                    f"hostfile {str(path)!r} line {number} {raw.strip()!r}: expected "
                    "'<host> slots=<N>' with N >= 1"
                )
            slots = value
        if ":" in host or "," in host:
            raise HostfileError(
                f"hostfile {str(path)!r} line {number} {raw.strip()!r}: the host name "
                "must not contain ':' or ','"
            )
        hosts.append(f"{host}:{slots}")
    if not hosts:
        raise HostfileError(f"hostfile {str(path)!r} names no host")
    return ",".join(hosts)
