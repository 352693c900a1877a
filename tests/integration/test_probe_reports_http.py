"""Peer probes over HTTP: the round's answer carries the peers to probe with their probe
listeners, and heartbeats carry probe reports and step paces; malformed or foreign reports get
a 4xx and change nothing. The notices poll gives SUSPEND notices like any other."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from elasticjob.rendezvous.rendezvous_types import ProbeReport
from elasticjob.wire.messages import NoticeKind, StepPace
from tests.support.rendezvous_http import Cluster, rendezvous_body, snapshot, started_cluster
from tests.support.rendezvous_jobs import W0, W1, slots_for

pytestmark = pytest.mark.integration

HEARTBEAT = "/v1/jobs/job-a/heartbeat"


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    """Round 1 of job-a: W0 (rank 0) and W1, both registered."""
    async with started_cluster(client_timeout_s=30) as cluster:
        await cluster.rendezvous(W0)
        await cluster.rendezvous(W1)
        cluster.job_a.publish_round(1, slots_for([W0, W1]), sync=True)
        yield cluster


async def test_a_worker_gets_its_peers_with_their_probe_ports(cluster: Cluster) -> None:
    status, body = await cluster.call("POST", "/v1/jobs/job-a/rendezvous", json=rendezvous_body(W1))
    assert status == 200 and isinstance(body, dict), body
    peer = {"hostname": "host-a", "local_rank": 0, "address": "addr-host-a", "store_port": 29506}
    assert body["peers"] == [{**peer, "probe_port": 30506}]


async def test_a_probe_report_reaches_the_driver(cluster: Cluster) -> None:
    body = {"hostname": "host-b", "local_rank": 0, "round": 1, "unreachable": [W0._asdict()]}
    status, _ = await cluster.call("POST", HEARTBEAT, json=body)
    assert status == 204
    assert cluster.listener_a.heartbeats == [W1]
    assert cluster.listener_a.reports == [(W1, ProbeReport(1, frozenset({W0})))]


async def test_a_step_pace_reaches_the_driver(cluster: Cluster) -> None:
    pace = {"round": 1, "steps": 25, "busy_s": 0.125}
    body = {"hostname": "host-b", "local_rank": 0, "pace": pace}
    status, _ = await cluster.call("POST", HEARTBEAT, json=body)
    assert status == 204
    assert cluster.listener_a.paces == [(W1, StepPace(round=1, steps=25, busy_s=0.125))]


async def test_a_worker_is_given_suspend_notices(cluster: Cluster) -> None:
    cluster.job_a.post_notice(NoticeKind.HOSTS_ADDED, ["host-c"])
    cluster.job_a.post_notice(NoticeKind.SUSPEND)
    status, body = await cluster.call("GET", "/v1/jobs/job-a/notices?after=0&wait=0")
    assert status == 200 and isinstance(body, dict), body
    assert [n["kind"] for n in body["notices"]] == ["HOSTS_ADDED", "SUSPEND"]
    assert body["latest_seq"] == 2


@pytest.mark.parametrize(
    ("changes", "status", "words"),
    [
        ({"unreachable": [{"hostname": "host-a", "local_rank": 0}]}, 422, "round"),
        ({"round": 1, "unreachable": [{"hostname": "host-a", "local_rank": 0}] * 2}, 422, "once"),
        ({"round": 1, "unreachable": [{"hostname": "host-z", "local_rank": 0}]}, 422, "probe"),
        ({"round": 1, "unreachable": [{"hostname": "host-a"}]}, 422, "local_rank"),
        ({"round": 1, "unreachable": "host-a"}, 422, "unreachable"),
        ({"round": 2}, 409, "newer"),
        ({"pace": {"round": 1, "steps": -1, "busy_s": 0.1}}, 422, "steps"),
        ({"pace": {"round": 1, "steps": 3, "busy_s": "fast"}}, 422, "busy_s"),
        (
            {"round": 1, "unreachable": [{"hostname": f"h{i}", "local_rank": 0} for i in range(4)]},
            422,
            "at most 3",
        ),
    ],
    ids=[
        "no-round",
        "repeated",
        "not-its-target",
        "no-slot",
        "not-a-list",
        "future",
        "negative-steps",
        "pace-not-a-number",
        "too-many",
    ],
)
async def test_malformed_reports_are_refused_and_change_nothing(
    cluster: Cluster, changes: dict[str, object], status: int, words: str
) -> None:
    before = snapshot(cluster.job_a, cluster.listener_a)
    got, body = await cluster.call(
        "POST", HEARTBEAT, json={"hostname": "host-b", "local_rank": 0} | changes
    )
    assert (got, words in str(body)) == (status, True), body
    assert snapshot(cluster.job_a, cluster.listener_a) == before
    assert cluster.listener_a.reports == []
