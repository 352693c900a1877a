"""``elasticjob-run``: horovodrun's elastic mode, on one machine.

    elasticjob-run -np 4 --min-np 2 --max-np 8 \\
        --host-discovery-script ./discover_hosts.sh python train.py

It runs the elastic driver and the rendezvous service in this process and starts a worker
process for every assigned (host, slot). The exit code is the job's result.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import secrets
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from elasticjob.driver.blacklist import Blacklist
from elasticjob.driver.discovery import discover_once, poll_hosts
from elasticjob.driver.driver import ElasticDriver
from elasticjob.driver.driver_types import DriverError, JobMode, JobResult
from elasticjob.driver.host_manager import HostManager
from elasticjob.driver.record_saving import RecordSaver
from elasticjob.driver.worker_exits import ExitCause
from elasticjob.launcher.arguments import build_parser, checkpoint_policy, parse_arguments
from elasticjob.launcher.horovodrun_flags import python_log_level
from elasticjob.launcher.job_settings import driver_settings, job_recovery
from elasticjob.launcher.output_files import RankOutputFiles, rank_width, write_timeline
from elasticjob.launcher.processes import (
    ORPHAN_TIMEOUT_S,
    LocalWorkerLauncher,
    WorkerEnvironment,
    restart_mode_command,
)
from elasticjob.launcher.record_file import RecordFile
from elasticjob.launcher.warm_workers import serve_starts
from elasticjob.rendezvous.job_credentials import JobKey
from elasticjob.rendezvous.limits import DEFAULT_MAX_WORKERS
from elasticjob.rendezvous.server import RendezvousService
from elasticjob.worker_contract import WorkerSettings

logger = logging.getLogger("elasticjob.launcher")


async def run_job(args: argparse.Namespace) -> JobResult:
    """Run the job ``args`` describe and return its result."""
    discovery, settings, policy = driver_settings(args)
    output_files = None
    if args.output_filename:
        try:
            output_files = RankOutputFiles(
                Path(args.output_filename), rank_width(args.np, settings.max_np)
            )
        except OSError as exc:
            raise DriverError(f"--output-filename {args.output_filename!r}: {exc}") from exc

    checkpoint = checkpoint_policy(args)
    if checkpoint is not None:
        try:
            Path(checkpoint.folder).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DriverError(f"--checkpoint-dir {args.checkpoint_dir!r}: {exc}") from exc
    timeline_dir = (
        tempfile.mkdtemp(prefix="elasticjob-timeline-") if args.timeline_filename else None
    )
    restart = JobMode(args.mode) is JobMode.RESTART
    command = restart_mode_command(args.command) if restart else list(args.command)
    service = RendezvousService()
    await service.start("127.0.0.1", 0)
    key = secrets.token_urlsafe(32)
    environment = WorkerEnvironment(
        WorkerSettings.model_validate(
            {
                "rendezvous_url": service.url,
                "job": args.job_name,
                "backend": args.backend,
                "heartbeat_interval_s": settings.heartbeat_interval_s,
                "orphan_timeout_s": ORPHAN_TIMEOUT_S,
                "timeline_dir": timeline_dir,
                "checkpoint": checkpoint,
                "max_restarts": job_recovery(args).script_max_restarts,
                "warm_start": args.warm_start if restart else None,
            }
        ),
        key=JobKey(key),
        network_interface=",".join(args.nics) if args.nics else None,
    )

    def make_launcher(driver: ElasticDriver) -> LocalWorkerLauncher:
        return LocalWorkerLauncher(
            command,
            environment,
            lambda worker, code: driver.on_worker_exit(worker, code, ExitCause.SLOT_ENDED),
            driver.rank_of,
            warm=args.warm_start and not restart,
            start_server=args.start_server,
            output_files=output_files,
        )

    try:
        driver = ElasticDriver(
            HostManager(Blacklist[str](policy)),
            make_launcher,
            lambda listener: service.add_job(
                args.job_name,
                key,
                listener,
                max_workers=settings.max_np or DEFAULT_MAX_WORKERS,
                heartbeat_interval_s=settings.heartbeat_interval_s,
            ),
            settings,
            time.monotonic,
        )
        saver = None
        if args.job_record:
            driver.start_record(args.job_name, time.time, " ".join(args.command))
            saver = RecordSaver(
                driver.journal, RecordFile(Path(args.job_record)), time.monotonic, driver.job_state
            )
        # SIGUSR1 (a batch scheduler's warning before preemption or a time limit) suspends
        # the job: the workers save their last commit and exit; the same command resumes it.
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, driver.suspend)
        await discover_once(discovery, driver)
        helpers = [asyncio.create_task(poll_hosts(discovery, driver), name="host discovery")]
        if saver is not None:
            helpers.append(asyncio.create_task(saver.run(), name="job record"))
        try:
            return await driver.run()
        finally:
            for helper in helpers:
                helper.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            if saver is not None:
                await saver.save_now()
    finally:
        await service.stop()
        if timeline_dir is not None:
            write_timeline(Path(timeline_dir), Path(args.timeline_filename))


EXIT_SUSPENDED: Final = 3
"""The exit status of a job suspended by SIGUSR1."""


async def _run_until_signalled(args: argparse.Namespace) -> JobResult:
    """Run the job; SIGTERM stops it like Ctrl-C does, stopping every worker first."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await run_job(args)
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``elasticjob-run``; return its exit status (2: a usage or setup error)."""
    try:
        args = parse_arguments(build_parser(), argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    if args.serve_starts:
        serve_starts(args.serve_starts, args.command[0] if args.command else sys.executable)
    level = logging.DEBUG if args.verbose else logging.INFO
    logging.basicConfig(
        level=python_log_level(args.log_level) if args.log_level else level,
        format="elasticjob-run %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not args.verbose:
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    try:
        result = asyncio.run(_run_until_signalled(args))
    except DriverError as exc:
        print(f"elasticjob-run: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    if result.suspended:
        resume = (
            "the same command resumes it from the checkpoint"
            if args.checkpoint_dir
            else "without --checkpoint-dir, the same command starts it afresh"
        )
        print(f"elasticjob-run: job {result.message}; {resume}", file=sys.stderr)
        return EXIT_SUSPENDED
    if not result.success:
        print(f"elasticjob-run: job failed: {result.message}", file=sys.stderr)
        return 1
    print(
        f"elasticjob-run: job succeeded after {result.rounds} rounds and {result.resets} resets",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
