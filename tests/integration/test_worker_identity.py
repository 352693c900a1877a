"""Each worker speaks only for itself, over real HTTP against a real rendezvous service: a
request that changes state with the credential of another host of the same job (or with the
job's reader token) is refused with 403 and changes nothing, for every route and every forged
request the security review sent; the same request with the speaker's own credential is
served, so each row can fail."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from elasticjob.rendezvous.health_rule import HealthPolicy
from elasticjob.wire.messages import WorkerId
from tests.support.health_checks import RecordedVerdicts
from tests.support.rendezvous_http import (
    Cluster,
    credential,
    reader_token,
    rendezvous_body,
    snapshot,
    started_cluster,
)
from tests.support.rendezvous_jobs import W0, W1, slots_for

FORGED_STORE = {"address": "127.0.1.99", "store_port": 1}
"""Where a forged request would send the honest workers."""


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    """job-a with a round in force: W0 (host-a) rank 0, W1 (host-b) rank 1."""
    async with started_cluster() as started:
        await started.rendezvous(W0)
        await started.rendezvous(W1)
        started.job_a.publish_round(1, slots_for([W0, W1]), sync=False)
        yield started


SPOOFS: list[tuple[str, dict[str, object]]] = [
    # a member asks for the next round as W0, with another store for the round
    ("rendezvous", rendezvous_body(W0, after_round=1) | FORGED_STORE),
    # ... as rank 0 that rolled back, failing the round
    ("rendezvous", rendezvous_body(W0, after_round=1) | {"rolled_back": True}),
    # ... as a member that suspended, changing how the job ends
    ("rendezvous", rendezvous_body(W0, after_round=1) | {"suspended": True}),
    ("results", {"hostname": W0.hostname, "local_rank": 0, "state": "SUCCESS"}),
    ("heartbeat", {"hostname": W0.hostname, "local_rank": 0}),
]


@pytest.mark.parametrize(("route", "body"), SPOOFS, ids=lambda v: v if isinstance(v, str) else "")
async def test_a_request_for_another_worker_is_403_and_changes_nothing(
    cluster: Cluster, route: str, body: dict[str, object]
) -> None:
    before = snapshot(cluster.job_a, cluster.listener_a)
    path = f"/v1/jobs/job-a/{route}"
    for token, speaker in [
        (credential(W1.hostname), "host-b's credential"),
        (reader_token(), "the job's reader token"),
    ]:
        status, answer = await cluster.call("POST", path, token=token, json=body)
        assert status == 403 and answer["error"] == f"{speaker} does not speak for 'host-a'"
        assert snapshot(cluster.job_a, cluster.listener_a) == before
    status, _ = await cluster.call("POST", path, token=credential(W0.hostname), json=body)
    assert status in (200, 204), "its own credential speaks for it"


async def test_progress_is_the_rank_0_hosts_to_report() -> None:
    async with started_cluster() as cluster:
        body = {"round": 0, "epoch": 12345, "step": 1}
        status, answer = await cluster.call("POST", "/v1/jobs/job-a/progress", json=body)
        assert status == 403 and "rank 0 of the round in force" in answer["error"], "no round"
        await cluster.rendezvous(W0)
        await cluster.rendezvous(W1)
        cluster.job_a.publish_round(1, slots_for([W0, W1]), sync=False)
        before = snapshot(cluster.job_a, cluster.listener_a)
        for token in (credential(W1.hostname), reader_token()):
            status, answer = await cluster.call(
                "POST", "/v1/jobs/job-a/progress", token=token, json=body
            )
            assert status == 403 and "rank 0 of the round in force" in answer["error"]
        assert snapshot(cluster.job_a, cluster.listener_a) == before
        status, _ = await cluster.call(
            "POST", "/v1/jobs/job-a/progress", token=credential(W0.hostname), json=body
        )
        assert status == 204 and cluster.job_a.round_info().progress is not None


async def test_reads_take_any_credential_of_the_job_and_the_reader_token(
    cluster: Cluster,
) -> None:
    for token in (credential(W1.hostname), reader_token()):
        for path in ("round", "plan", "notices"):
            status, _ = await cluster.call("GET", f"/v1/jobs/job-a/{path}", token=token)
            assert status == 200, (path, token)
    for token in (credential(W0.hostname, job="job-b"), reader_token("job-b"), "key-of-job-a"):
        status, _ = await cluster.call("GET", "/v1/jobs/job-a/round", token=token)
        assert status == 403, "another job's credentials and the key itself are none of job-a's"


def cohort_body(host: str, store: str) -> dict[str, object]:
    return {"hostname": host, "address": store, "store_port": 1, "wait_seconds": 0.0}


async def test_a_pod_checks_its_own_health_only() -> None:
    """The review's forged health requests: a cohort request as pod-a with a store of its
    choosing (honest pods would be sent to it), and a report as pod-b (failing, or passing
    it without a check)."""
    async with started_cluster() as cluster:
        verdicts = RecordedVerdicts()
        checks = cluster.job_a.check_health(HealthPolicy(min_relative=0.05), verdicts)
        verdicts.checks = checks
        checks.expect(["pod-a", "pod-b"])
        path = "/v1/jobs/job-a/health"
        status, answer = await cluster.call(
            "POST",
            f"{path}/cohort",
            token=credential("pod-b"),
            json=cohort_body("pod-a", "127.0.1.99"),
        )
        assert status == 403 and answer["error"] == "pod-b's credential does not speak for 'pod-a'"
        answers = [
            await cluster.call("POST", f"{path}/cohort", json=cohort_body(pod, f"10.0.0.{i}"))
            for i, pod in enumerate(("pod-a", "pod-b"), start=1)
        ]
        assert [a[0] for a in answers] == [200, 200]
        # The cohort closed with both pods; its rank 0 serves the store it asked with itself.
        stores = {a[1]["store_address"] for a in answers} - {None}
        assert "127.0.1.99" not in stores
        report = {
            "hostname": "pod-b",
            "cohort": 1,
            "seconds": 1.0,
            "figures": {"device": "cpu", "compute_gflops": 1e7, "copy_gbps": 1e5},
        }
        status, answer = await cluster.call(
            "POST", f"{path}/report", token=credential("pod-a"), json=report
        )
        assert status == 403 and answer["error"] == "pod-a's credential does not speak for 'pod-b'"
        assert checks.verdict("pod-b") is None and not verdicts.heard


async def test_a_worker_of_one_job_holds_no_credential_of_another() -> None:
    async with started_cluster() as cluster:
        before = snapshot(cluster.job_b, cluster.listener_b)
        beat = {"hostname": W0.hostname, "local_rank": 0}
        status, _ = await cluster.call(
            "POST", "/v1/jobs/job-b/heartbeat", token=credential(W0.hostname), json=beat
        )
        assert status == 403, "job-a's credential for host-a is not job-b's"
        assert snapshot(cluster.job_b, cluster.listener_b) == before
        assert WorkerId(W0.hostname, 0) not in cluster.listener_b.heartbeats
