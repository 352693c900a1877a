"""horovodrun's spellings that ``elasticjob-run`` takes, and those it refuses.

horovodrun (``horovod/runner/launch.py``) has flags that cannot apply to this launcher: MPI,
jsrun and SSH options, the tuning knobs of Horovod's C++ background thread (there is none
here: collectives are ``torch.distributed``'s). Each of them is refused with a usage error
that names it and says why, never silently ignored.
"""

from __future__ import annotations

import argparse
import logging
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
    ("--fusion-threshold-mb",): _CORE,
    ("--cycle-time-ms",): _CORE,
    ("--cache-capacity",): _CORE,
    ("--hierarchical-allreduce",): _CORE,
    ("--no-hierarchical-allreduce",): _CORE,
    ("--hierarchical-allgather",): _CORE,
    ("--no-hierarchical-allgather",): _CORE,
    ("--torus-allreduce",): _CORE,
    ("--no-torus-allreduce",): _CORE,
    ("--autotune",): _CORE,
    ("--no-autotune",): _CORE,
    ("--autotune-log-file",): _CORE,
    ("--autotune-warmup-samples",): _CORE,
    ("--autotune-steps-per-sample",): _CORE,
    ("--autotune-bayes-opt-max-samples",): _CORE,
    ("--autotune-gaussian-process-noise",): _CORE,
    ("--timeline-mark-cycles",): _CORE,
    ("--no-timeline-mark-cycles",): _CORE,
    ("--stall-check",): _CORE,
    ("--no-stall-check",): _CORE,
    ("--stall-check-warning-time-seconds",): _CORE,
    ("--stall-check-shutdown-time-seconds",): _CORE,
    ("--num-nccl-streams",): _CORE,
    ("--thread-affinity",): _CORE,
    ("--gloo-timeout-seconds",): (
        "collectives here abort when the round breaks; their timeout is torch.distributed's"
    ),
    ("--log-with-timestamp",): _CORE,
    ("--log-without-timestamp",): _CORE,
    ("--log-hide-timestamp",): _CORE,
    ("--no-log-hide-timestamp",): _CORE,
    ("-prefix-timestamp", "--prefix-output-with-timestamp"): (
        "elasticjob-run prefixes output lines with the rank only"
    ),
}
"""Every horovodrun flag that cannot apply here, with the reason."""


class _Refuse(argparse.Action):
    """Fails the parse at once, naming the flag and why it cannot apply."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        self.reason = str(kwargs.pop("help"))
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        parser.error(
            f"horovodrun's {option_string} does not apply to elasticjob-run: {self.reason}"
        )


def add_refused_flags(parser: argparse.ArgumentParser) -> None:
    """Make every flag of :data:`REFUSED` a usage error naming it."""
    for names, reason in REFUSED.items():
        parser.add_argument(*names, action=_Refuse, dest="refused", help=reason)


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
