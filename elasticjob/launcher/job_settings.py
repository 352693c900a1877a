"""What the checked arguments of ``elasticjob-run`` (``arguments.py``) mean for the driver:
its host discovery, settings, recovery and blacklist policy."""

from __future__ import annotations

import argparse

from elasticjob.driver.blacklist import BlacklistPolicy
from elasticjob.driver.discovery import FixedHosts, HostDiscovery, ScriptDiscovery, parse_hosts
from elasticjob.driver.driver_types import DriverError, DriverSettings, JobMode, Recovery, recovery


def fixed_hosts(args: argparse.Namespace) -> str:
    """The ``-H`` (or ``--hostfile``) host list, or this machine with ``-np`` slots."""
    return str(args.hosts or f"localhost:{args.np or 1}")


def is_elastic(args: argparse.Namespace) -> bool:
    """horovodrun's elastic mode: a discovery script or ``--min-np`` given."""
    return bool(args.host_discovery_script) or args.min_np is not None


def max_np(args: argparse.Namespace) -> int | None:
    """``--max-np``, or horovodrun's default: unbounded (None) in elastic mode, else ``-np``
    (horovodrun's static mode runs exactly ``-np`` processes)."""
    if args.max_np is not None or is_elastic(args):
        return int(args.max_np) if args.max_np is not None else None
    return int(args.np) if args.np is not None else None


def min_np(args: argparse.Namespace) -> int:
    """``--min-np``, else ``-np`` (else 1)."""
    return int(args.min_np if args.min_np is not None else (args.np or 1))


def job_recovery(args: argparse.Namespace) -> Recovery:
    """How the job of checked arguments recovers (see
    :func:`~elasticjob.driver.driver_types.recovery`)."""
    return recovery(
        JobMode(args.mode),
        max_restarts=args.max_restarts,
        checkpoints=bool(args.checkpoint_dir),
        max_failed_rounds_without_commit=args.max_failed_rounds_without_commit,
    )


def driver_settings(
    args: argparse.Namespace,
) -> tuple[HostDiscovery, DriverSettings, BlacklistPolicy]:
    """The job's host discovery, driver settings and blacklist policy from checked arguments
    (raises :class:`DriverError` for settings the driver refuses)."""
    discovery: HostDiscovery
    if args.host_discovery_script:
        discovery = ScriptDiscovery(args.host_discovery_script, default_slots=args.slots)
    else:
        discovery = FixedHosts(parse_hosts(fixed_hosts(args), args.slots))
    job = job_recovery(args)
    try:
        settings = DriverSettings(
            min_np=min_np(args),
            max_np=max_np(args),
            reset_limit=args.reset_limit,
            restart_limit=job.restart_limit,
            max_failed_rounds_without_commit=job.max_failed_rounds_without_commit,
            elastic_timeout_s=args.elastic_timeout,
            start_timeout_s=args.start_timeout,
            removal_grace_s=args.removal_grace,
            heartbeat_timeout_s=args.heartbeat_timeout or None,
            checkpoint_fallback=job.checkpoint_fallback,
        )
        policy = BlacklistPolicy(*args.blacklist_cooldown_range)
    except ValueError as exc:
        raise DriverError(str(exc)) from exc
    return discovery, settings, policy
