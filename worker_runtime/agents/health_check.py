"""``python -m elasticjob.worker_runtime.agents.health_check -- COMMAND...``: a pod's health check
before it joins its job (``spec.healthCheck``; the operator puts it in front of the pod's
command), then ``COMMAND`` in its place.

The check asks the rendezvous service for its cohort (the pods starting at about the same
time), runs one Gloo all-reduce with the cohort on a fresh store prefix (its first member
serves the store, the others connect: a round's store, ``rounds/joiner.py``), measures the pod's
compute and copy bandwidth (``health_benchmarks.py``), reports its figures and waits for the
verdict: passed, it executes ``COMMAND`` (the check's memory and any CUDA context go with the
old process image); failed, it exits :data:`EXIT_UNHEALTHY` (the operator has blacklisted
the node and deletes the pod); inconclusive (another pod broke the collective), it checks
again in a new cohort. The job's members train on meanwhile: a pod is not offered to the
job until it passed.
"""

from __future__ import annotations

import datetime
import functools
import logging
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Final, TypeVar

from torch.distributed import Store

from elasticjob.wire.health import (
    CohortRequest,
    CohortResponse,
    HealthProblem,
    HealthReport,
    HealthVerdict,
    VerdictStatus,
)
from elasticjob.worker_contract import EXIT_UNHEALTHY, HEALTH_CHECK_MODULE, WorkerConfig
from elasticjob.worker_runtime.agents.health_benchmarks import (
    BenchmarkBroken,
    CollectiveBroken,
    measure,
    measure_in_cohort,
)
from elasticjob.worker_runtime.exceptions import HorovodInternalError
from elasticjob.worker_runtime.link.rendezvous_client import RendezvousClient, RendezvousClientError
from elasticjob.worker_runtime.rounds.joiner import round_store, serve_store
from elasticjob.worker_runtime.worker_process import pin_interfaces, wrapped_command

logger = logging.getLogger(__name__)

EXIT_NOT_RUN: Final = 127
"""The exit status when the command after ``--`` cannot be run (as a shell's)."""
LOG_FORMAT: Final = "health-check %(levelname)s %(name)s: %(message)s"
POLL_S: Final = 20.0
"""How long one cohort or verdict request waits at the service."""
CHECK_DEADLINE_S: Final = 3600.0
"""Longest the check keeps asking (the operator's own timeout fails the pod first)."""
COLLECTIVE_TIMEOUT_S: Final = 60.0


_Answer = TypeVar("_Answer")


def _long_poll(
    ask: Callable[..., _Answer], news: Callable[[_Answer], bool], deadline: float, what: str
) -> _Answer:
    """``ask(retry_for_s=...)`` again until its answer is ``news``; TimeoutError at
    ``deadline``."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no health-check {what} came in time")
        answer = ask(retry_for_s=left)
        if news(answer):
            return answer


def _cohort_store(server: Store, cohort: CohortResponse, timeout: datetime.timedelta) -> Store:
    """The cohort's store, formed as a round's (:func:`round_store`): its first member's."""
    assert cohort.store_address is not None and cohort.store_port is not None
    master = (cohort.store_address, cohort.store_port)
    try:
        return round_store(server, cohort.rank, master, timeout)
    except HorovodInternalError as exc:
        raise CollectiveBroken(str(exc)) from exc


def _run_cohort(
    config: WorkerConfig, server: Store, cohort: CohortResponse, started: float
) -> HealthReport:
    """Run the collective and the benchmarks in ``cohort``; the report to send."""
    report = {"hostname": config.hostname, "cohort": cohort.cohort, "wait_seconds": POLL_S}
    try:
        if cohort.size > 1:
            budget = min(COLLECTIVE_TIMEOUT_S, max(cohort.deadline_seconds / 2, 1.0))
            timeout = datetime.timedelta(seconds=budget)
            store = _cohort_store(server, cohort, timeout)
            figures = measure_in_cohort(
                store, cohort.store_prefix, cohort.rank, cohort.size, timeout
            )
        else:
            figures = measure(None)
    except CollectiveBroken as exc:
        logger.warning("health cohort %d: %s", cohort.cohort, exc)
        return HealthReport(
            **report,
            seconds=time.monotonic() - started,
            problem=HealthProblem.COLLECTIVE,
            message=str(exc)[:1024],
        )
    except BenchmarkBroken as exc:
        logger.error("health check: %s", exc)
        return HealthReport(
            **report,
            seconds=time.monotonic() - started,
            problem=HealthProblem.BENCHMARK,
            message=str(exc)[:1024],
        )
    logger.info(
        "health cohort %d (%d pods): compute %.3g GFLOP/s, copy %.3g GB/s, collective %s",
        cohort.cohort,
        cohort.size,
        figures.compute_gflops,
        figures.copy_gbps,
        "none" if figures.collective_s is None else f"{figures.collective_s * 1000:.1f} ms",
    )
    return HealthReport(**report, seconds=time.monotonic() - started, figures=figures)


def check_pod(config: WorkerConfig, client: RendezvousClient) -> HealthVerdict:
    """Run this pod's check until a final verdict (see the module docstring)."""
    started = time.monotonic()
    deadline = started + CHECK_DEADLINE_S
    pin_interfaces(config.bind_address)
    server = serve_store(config.bind_address, datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    request = CohortRequest(
        hostname=config.hostname,
        address=config.bind_address,
        store_port=server.port,
        wait_seconds=POLL_S,
    )
    while True:
        cohort = _long_poll(
            functools.partial(client.health_cohort, request),
            lambda answer: answer.cohort > 0,
            deadline,
            "cohort",
        )
        report = _run_cohort(config, server, cohort, started)
        verdict = _long_poll(
            functools.partial(client.health_report, report),
            lambda answer: answer.status is not VerdictStatus.PENDING,
            deadline,
            "verdict",
        )
        if verdict.status is not VerdictStatus.RETRY:
            return verdict
        logger.info("health check again, in a new cohort: %s", verdict.reason)


def main(argv: Sequence[str] | None = None) -> int:
    """Check the pod, then run the command after ``--`` in this process's place."""
    args = wrapped_command(argv, HEALTH_CHECK_MODULE)
    if args is None:
        return 2
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stderr)
    config = WorkerConfig.from_env()
    if config is None:
        logger.warning("no launcher (no ELASTICJOB_RENDEZVOUS_URL): nothing to check")
    else:
        client = RendezvousClient.for_worker(config)
        try:
            verdict = check_pod(config, client)
        except (RendezvousClientError, TimeoutError) as exc:
            logger.error("%s could not finish its health check: %s", config.hostname, exc)
            return EXIT_UNHEALTHY
        if verdict.status is not VerdictStatus.PASSED:
            logger.error("%s failed its health check: %s", config.hostname, verdict.reason)
            return EXIT_UNHEALTHY
        logger.info("%s passed its health check: %s", config.hostname, verdict.reason)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(args[0], args)
    except OSError as exc:
        logger.error("cannot run %s: %s", args[0], exc)
        return EXIT_NOT_RUN


if __name__ == "__main__":
    sys.exit(main())
