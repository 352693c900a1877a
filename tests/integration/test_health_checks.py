"""New pods' health checks against a real rendezvous service over HTTP: the routes' refusals,
and real check processes (``python -m elasticjob.worker_runtime.agents.health_check -- CMD``) that
run a Gloo all-reduce with their cohort over loopback, measure, and run their command once
they passed, or check again when a member of their cohort never came."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator

import pytest

from elasticjob.rendezvous.health_rule import HealthPolicy
from elasticjob.wire.health import VerdictStatus
from elasticjob.worker_contract import (
    EXIT_UNHEALTHY,
    HEALTH_CHECK_MODULE,
    WorkerConfig,
    WorkerSettings,
)
from tests.support.health_checks import RecordedVerdicts
from tests.support.rendezvous_http import TOKEN_B, Cluster, credential, started_cluster

DEADLINE = 120.0
"""Upper bound on a check process's life (torch's import included, on a busy machine)."""
COMMAND = [
    sys.executable,
    "-c",
    "import os; print('command ran on', os.environ['ELASTICJOB_HOSTNAME'])",
]


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with started_cluster() as started:
        yield started


LENIENT = 0.05
"""The checks' threshold here: members on this loaded machine measure within a factor of two
of each other, and pass; one measured against a history 10^6 times faster still fails (where
the threshold lies is the rule's table test, tests/unit/rendezvous/test_health_rule.py)."""


GATHER_S = DEADLINE
"""How long a cohort gathers here: until every expected pod asked (it closes then), however
long a check process takes to start on a loaded machine (the default, 5 s, let a cohort
close before a slow process's first request)."""


def checked(cluster: Cluster, timeout_s: float = 60.0) -> RecordedVerdicts:
    verdicts = RecordedVerdicts()
    policy = HealthPolicy(min_relative=LENIENT, timeout_s=timeout_s, gather_s=GATHER_S)
    verdicts.checks = cluster.job_a.check_health(policy, verdicts)
    return verdicts


def cohort_body(host: str, wait: float = 0.0) -> dict[str, object]:
    return {"hostname": host, "address": "127.0.0.1", "store_port": 1, "wait_seconds": wait}


# ---- the routes ------------------------------------------------------------------------


async def test_a_job_without_health_checks_answers_404(cluster: Cluster) -> None:
    status, body = await cluster.call(
        "POST", "/v1/jobs/job-a/health/cohort", json=cohort_body("pod-a")
    )
    assert status == 404 and "no health checks" in body["error"]


async def test_bad_health_requests_are_refused_and_change_nothing(cluster: Cluster) -> None:
    verdicts = checked(cluster)
    checks = cluster.job_a.health_checks
    assert checks is not None
    path = "/v1/jobs/job-a/health"
    status, body = await cluster.call("POST", f"{path}/cohort", json=cohort_body("pod-a"))
    assert status == 503, "a pod the operator has not seen running yet retries"
    checks.expect(["pod-a"])
    status, body = await cluster.call(
        "POST", f"{path}/cohort", token=TOKEN_B, json=cohort_body("pod-a")
    )
    assert status == 403, "another job's token"
    both = {
        "hostname": "pod-a",
        "cohort": 1,
        "seconds": 1.0,
        "figures": {"device": "cpu", "compute_gflops": 1.0, "copy_gbps": 1.0},
        "problem": "Collective",
    }
    status, body = await cluster.call("POST", f"{path}/report", json=both)
    assert status == 422 and "either figures or a problem" in str(body["detail"])
    status, body = await cluster.call(
        "POST", f"{path}/report", json={**both, "problem": None, "seconds": -1}
    )
    assert status == 422 and body["detail"][0]["loc"] == ["seconds"]
    assert checks.verdict("pod-a") is None and not verdicts.heard
    status, body = await cluster.call("POST", f"{path}/cohort", json=cohort_body("pod-a"))
    assert (status, body["cohort"], body["size"]) == (200, 1, 1)
    status, body = await cluster.call(
        "POST", f"{path}/report", json={**both, "cohort": 2, "problem": None}
    )
    assert status == 422, "not its cohort"
    status, body = await cluster.call("POST", f"{path}/report", json={**both, "problem": None})
    assert (status, body["status"]) == (200, "Passed")
    assert verdicts.heard["pod-a"][0].status is VerdictStatus.PASSED


# ---- real check processes --------------------------------------------------------------


async def run_check(cluster: Cluster, host: str) -> tuple[int, str]:
    """Run a pod's check (then its command) as the operator would; its exit status and its
    output."""
    config = WorkerConfig.of(
        WorkerSettings(rendezvous_url=cluster.service.url, job="job-a"),
        token=credential(host),
        hostname=host,
        local_rank=0,
        bind_address="127.0.0.1",
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        HEALTH_CHECK_MODULE,
        "--",
        *COMMAND,
        env={**os.environ, **config.to_env()},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        output, _ = await asyncio.wait_for(process.communicate(), DEADLINE)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, output.decode(errors="replace")


async def test_pods_starting_together_check_as_one_cohort_and_then_run_their_command(
    cluster: Cluster,
) -> None:
    verdicts = checked(cluster)
    assert cluster.job_a.health_checks is not None
    cluster.job_a.health_checks.expect(["pod-a", "pod-b", "pod-c"])
    results = await asyncio.gather(*(run_check(cluster, f"pod-{x}") for x in "abc"))
    for host, (code, output) in zip(("pod-a", "pod-b", "pod-c"), results, strict=True):
        assert code == 0, output
        assert f"command ran on {host}" in output, output
        assert "passed its health check" in output, output
        verdict, seconds, figures = verdicts.heard[host]
        assert verdict.status is VerdictStatus.PASSED, verdict
        assert seconds is not None and seconds > 0
        assert figures is not None and figures.collective_s is not None, "one cohort of three"
        assert figures.compute_gflops > 0 and figures.copy_gbps > 0


async def test_a_pod_whose_cohort_peer_never_comes_checks_again_and_passes(
    cluster: Cluster,
) -> None:
    """pod-b asks for the cohort (over HTTP, as a pod would) and dies: pod-a, a real check
    process, cannot reach the cohort's store (pod-b's) and reports its broken collective;
    pod-b's pod is gone meanwhile (the operator stops expecting it, and carries its end out
    itself), so pod-a is excused, checks again alone, and passes."""
    verdicts = checked(cluster, timeout_s=40.0)
    checks = cluster.job_a.health_checks
    assert checks is not None
    checks.expect(["pod-a", "pod-b"])
    joined = asyncio.create_task(
        cluster.call("POST", "/v1/jobs/job-a/health/cohort", json=cohort_body("pod-b", 30.0))
    )
    check = asyncio.create_task(run_check(cluster, "pod-a"))
    status, body = await asyncio.wait_for(joined, DEADLINE)
    assert (status, body["size"], body["rank"]) == (200, 2, 0), "pod-b holds the store"
    checks.expect(["pod-a"])
    code, output = await asyncio.wait_for(check, DEADLINE)
    assert code == 0, output
    assert "health check again, in a new cohort" in output, output
    assert verdicts.outcomes().keys() == {"pod-a"}, "pod-b's end is the operator's to tell"
    assert verdicts.heard["pod-a"][0].status is VerdictStatus.PASSED


async def test_a_pod_far_slower_than_the_pods_before_it_fails_and_never_runs_its_command(
    cluster: Cluster,
) -> None:
    """The job's earlier pods (a cohort of two, so their figures set the bar) measured about
    a million times this machine's compute: the check fails and exits without running the
    command."""
    verdicts = checked(cluster)
    checks = cluster.job_a.health_checks
    assert checks is not None
    checks.expect(["pod-x", "pod-y"])
    fast = {"device": "cpu", "compute_gflops": 1e6, "copy_gbps": 5e4}
    for pod in ("pod-x", "pod-y"):
        body = cohort_body(pod)
        await cluster.call("POST", "/v1/jobs/job-a/health/cohort", json=body)
    for pod in ("pod-x", "pod-y"):
        report = {"hostname": pod, "cohort": 1, "seconds": 1.0, "figures": fast}
        status, _ = await cluster.call("POST", "/v1/jobs/job-a/health/report", json=report)
        assert status == 200
    assert [verdicts.heard[pod][0].status for pod in ("pod-x", "pod-y")] == [
        VerdictStatus.PASSED
    ] * 2
    checks.expect(["pod-a"])
    code, output = await run_check(cluster, "pod-a")
    assert code == EXIT_UNHEALTHY, output
    assert "command ran" not in output and "failed its health check: compute" in output
    assert verdicts.heard["pod-a"][0].status is VerdictStatus.FAILED
