"""Peer probes over HTTP: the round's answer carries the peers to probe (from version 3, with
their probe listener from version 6: an older worker refuses fields it does not know), and
heartbeats carry probe reports and step paces; malformed or foreign reports get a 4xx and
change nothing. A worker older than version 8 is not given SUSPEND notices (a kind it would
refuse)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from elasticjob.rendezvous.rendezvous_types import ProbeReport
from elasticjob.rendezvous.server import RendezvousService
from elasticjob.wire.messages import NoticeKind, PeerEndpoint, RendezvousResponse, StepPace
from elasticjob.wire.protocol import PROTOCOL_HEADER, PROTOCOL_VERSION
from tests.support.rendezvous_http import Cluster, rendezvous_body, snapshot
from tests.support.rendezvous_jobs import W0, W1, slots_for

pytestmark = pytest.mark.integration

HEARTBEAT = "/v1/jobs/job-a/heartbeat"


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    """Round 1 of job-a: W0 (rank 0) and W1, both registered."""
    service = RendezvousService()
    await service.start("127.0.0.1", 0)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        cluster = Cluster(service, session)
        await cluster.rendezvous(W0)
        await cluster.rendezvous(W1)
        cluster.job_a.publish_round(1, slots_for([W0, W1]), sync=True)
        yield cluster
    await service.stop()


async def ask(cluster: Cluster, version: int) -> dict[str, Any]:
    status, body = await cluster.call(
        "POST",
        "/v1/jobs/job-a/rendezvous",
        json=rendezvous_body(W1),
        headers={PROTOCOL_HEADER: str(version)},
    )
    assert status == 200, body
    assert isinstance(body, dict)
    return body


async def test_each_worker_gets_the_peer_fields_of_its_protocol_version(
    cluster: Cluster,
) -> None:
    """Version 6 gets the peers' probe ports, versions 3 to 5 the peers without them, version
    2 no peers."""
    peer = {"hostname": "host-a", "local_rank": 0, "address": "addr-host-a", "store_port": 29506}
    current = await ask(cluster, PROTOCOL_VERSION)
    assert current["peers"] == [{**peer, "probe_port": 30506}]
    for version in (3, 5):
        before_6 = await ask(cluster, version)
        assert before_6["peers"] == [peer]
        # What a version-5 worker parses it with: the same strict model, without the field.
        assert set(before_6["peers"][0]) <= set(PeerEndpoint.model_fields) - {"probe_port"}
    old = await ask(cluster, 2)
    assert "peers" not in old and old["status"] == "ASSIGNED"
    # What a version-2 worker parses it with: the same strict model, without the field.
    assert set(old) <= set(RendezvousResponse.model_fields) - {"peers"}


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


async def test_a_worker_older_than_suspend_notices_is_not_given_them(cluster: Cluster) -> None:
    cluster.job_a.post_notice(NoticeKind.HOSTS_ADDED, ["host-c"])
    cluster.job_a.post_notice(NoticeKind.SUSPEND)
    for version, kinds in ((PROTOCOL_VERSION, ["HOSTS_ADDED", "SUSPEND"]), (7, ["HOSTS_ADDED"])):
        status, body = await cluster.call(
            "GET", "/v1/jobs/job-a/notices?after=0&wait=0", headers={PROTOCOL_HEADER: str(version)}
        )
        assert status == 200 and isinstance(body, dict), body
        assert [n["kind"] for n in body["notices"]] == kinds
        assert body["latest_seq"] == 2, "the older worker skips the notice it is not given"


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
