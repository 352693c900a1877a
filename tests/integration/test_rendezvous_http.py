"""The rendezvous service over real HTTP: a server on a loopback port and an aiohttp client."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml  # type: ignore[import-untyped]
from pydantic import BaseModel

from elasticjob.rendezvous.request_bodies import MAX_BODY_BYTES
from elasticjob.rendezvous.server import RendezvousService
from elasticjob.wire.health import (
    CohortRequest,
    CohortResponse,
    HealthFigures,
    HealthProblem,
    HealthReport,
    HealthVerdict,
    VerdictStatus,
)
from elasticjob.wire.messages import (
    CheckpointReport,
    ErrorResponse,
    ExitAnswer,
    ExitReport,
    HeartbeatRequest,
    HeldShards,
    Notice,
    NoticeKind,
    NoticesResponse,
    PlannedRound,
    ProgressRequest,
    RendezvousRequest,
    RendezvousResponse,
    RendezvousStatus,
    ResultRequest,
    RoundInfo,
    SlotInfo,
    WorkerState,
)
from elasticjob.wire.protocol import PROTOCOL_VERSION
from tests.support.rendezvous_http import (
    TOKEN_A,
    TOKEN_B,
    Cluster,
    rendezvous_body,
    snapshot,
    started_cluster,
)
from tests.support.rendezvous_jobs import W0, W1, RecordingListener, slots_for

DEADLINE = 5.0
"""Upper bound on any await that must complete (a hang fails the test instead)."""

OPENAPI = Path(__file__).resolve().parents[2] / "docs" / "rendezvous-api.yaml"


async def until_done(task: Awaitable[Any]) -> Any:
    return await asyncio.wait_for(task, DEADLINE)


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with started_cluster() as started:
        yield started


ROUTES: list[tuple[str, str, object]] = [
    ("POST", "rendezvous", rendezvous_body(W0)),
    ("GET", "notices", None),
    ("POST", "results", {"hostname": "host-a", "local_rank": 0, "state": "SUCCESS"}),
    ("POST", "progress", {"round": 0, "epoch": 0, "step": 1}),
    ("GET", "round", None),
    ("POST", "heartbeat", {"hostname": "host-a", "local_rank": 0}),
    ("POST", "exits", {"hostname": "host-a", "local_rank": 0, "exit_code": -9}),
]


# ---- rounds ----------------------------------------------------------------------------


async def test_full_round_flow(cluster: Cluster) -> None:
    assert (await cluster.rendezvous(W0)).status is RendezvousStatus.PENDING
    assert (await cluster.rendezvous(W1)).status is RendezvousStatus.PENDING
    cluster.job_a.publish_round(1, slots_for([W1, W0]), sync=False)

    a, b = await asyncio.gather(cluster.rendezvous(W0), cluster.rendezvous(W1))
    assert a.status is b.status is RendezvousStatus.ASSIGNED
    assert a.slot is not None and b.slot is not None
    assert (a.slot.rank, b.slot.rank) == (1, 0)
    for answer in (a, b):
        assert (answer.round, answer.sync) == (1, False)
        assert (answer.store_address, answer.store_port) == ("addr-host-b", 29506)

    retry = await until_done(cluster.rendezvous(W0, after_round=0, wait=60))
    assert retry.status is RendezvousStatus.ASSIGNED and retry.round == 1
    status, info = await cluster.call("GET", "/v1/jobs/job-a/round")
    assert status == 200
    assert RoundInfo.model_validate(info).hosts == ("host-b", "host-a")


async def test_the_planned_round_is_served_to_workers_being_added(cluster: Cluster) -> None:
    status, empty = await cluster.call("GET", "/v1/jobs/job-a/plan")
    assert (status, empty) == (200, {"round": 0, "slots": []})
    cluster.job_a.plan_next(1, slots_for([W0, W1]))
    status, body = await cluster.call("GET", "/v1/jobs/job-a/plan")
    assert status == 200
    planned = PlannedRound.model_validate(body)
    assert [(s.hostname, s.rank, s.size) for s in planned.slots] == [
        ("host-a", 0, 2),
        ("host-b", 1, 2),
    ]
    assert (await cluster.call("GET", "/v1/jobs/job-a/plan", token=TOKEN_B))[0] == 403


async def test_long_poll_wakes_on_publish(cluster: Cluster) -> None:
    await cluster.rendezvous(W0)
    cluster.listener_a.ready_event.clear()
    waiter = asyncio.create_task(cluster.rendezvous(W1, wait=60))
    await until_done(cluster.listener_a.ready_event.wait())
    assert not waiter.done()
    cluster.job_a.publish_round(1, slots_for([W0, W1]), sync=True)
    answer = await until_done(waiter)
    assert answer.status is RendezvousStatus.ASSIGNED
    assert (answer.store_address, answer.notice_seq) == ("addr-host-a", 0)


async def test_pending_after_short_wait(cluster: Cluster) -> None:
    answer = await until_done(cluster.rendezvous(W0, wait=0.05))
    assert answer.status is RendezvousStatus.PENDING


async def test_removed_and_finished(cluster: Cluster) -> None:
    waiter = asyncio.create_task(cluster.rendezvous(W1, wait=60))
    await until_done(cluster.listener_a.ready_event.wait())
    cluster.listener_a.dismissed.add(W1)  # the driver dismissed it, then tells the job
    cluster.job_a.dismiss([W1])
    assert (await until_done(waiter)).status is RendezvousStatus.REMOVED

    cluster.listener_a.ready_event.clear()
    waiter = asyncio.create_task(cluster.rendezvous(W0, wait=60))
    await until_done(cluster.listener_a.ready_event.wait())
    cluster.job_a.finish("training complete")
    answer = await until_done(waiter)
    assert (answer.status, answer.message) == (RendezvousStatus.FINISHED, "training complete")


async def test_remove_job_finishes_waiters_then_403(cluster: Cluster) -> None:
    waiter = asyncio.create_task(cluster.rendezvous(W0, wait=60))
    await until_done(cluster.listener_a.ready_event.wait())
    cluster.service.remove_job("job-a")
    assert (await until_done(waiter)).status is RendezvousStatus.FINISHED
    status, body = await cluster.call("GET", "/v1/jobs/job-a/round")
    assert status == 403 and "job-a" in body["error"]
    status, body = await cluster.call("GET", "/healthz", token=None)
    assert (status, body) == (200, {"status": "ok"}), "the job count is not revealed"


async def test_listener_told_once_per_worker_and_after_round(cluster: Cluster) -> None:
    await cluster.rendezvous(W0)
    cluster.job_a.publish_round(4, slots_for([W0]), sync=True)
    for after_round in (0, 0, 4, 4):
        await cluster.rendezvous(W0, after_round=after_round)
    assert cluster.listener_a.ready == [(W0, 0), (W0, 4)]


async def test_results_and_progress(cluster: Cluster) -> None:
    await cluster.rendezvous(W0)
    cluster.job_a.publish_round(1, slots_for([W0]), sync=True)  # progress is rank 0's
    for method, route, body in ROUTES[2:4]:
        status, answer = await cluster.call(method, f"/v1/jobs/job-a/{route}", json=body)
        assert (status, answer) == (204, None)
    assert cluster.listener_a.results[0].state is WorkerState.SUCCESS
    assert cluster.listener_a.progress[0].step == 1
    status, info = await cluster.call("GET", "/v1/jobs/job-a/round")
    assert status == 200 and info["progress"]["step"] == 1


async def test_a_pods_report_of_its_slots_exit_reaches_the_listener_for_its_own_slots_only(
    cluster: Cluster,
) -> None:
    await cluster.rendezvous(W0)
    await cluster.rendezvous(W1)
    body = {"hostname": "host-a", "local_rank": 0, "exit_code": -9}
    exits = "/v1/jobs/job-a/exits"
    told = {"restart": False, "reason": ""}
    assert await cluster.call("POST", exits, token=TOKEN_A, json=body) == (200, told)
    cluster.listener_a.exit_answer = ExitAnswer(restart=True, reason="a sibling lives on")
    told = {"restart": True, "reason": "a sibling lives on"}
    assert await cluster.call("POST", exits, token=TOKEN_A, json=body) == (200, told)
    before = snapshot(cluster.job_a, cluster.listener_a)
    other = {"hostname": "host-b", "local_rank": 0, "exit_code": -9}
    status, answer = await cluster.call("POST", exits, token=TOKEN_A, json=other)
    assert status == 403 and "host-b" in answer["error"]
    assert snapshot(cluster.job_a, cluster.listener_a) == before
    assert cluster.listener_a.exits == [(W0, -9), (W0, -9)]


async def test_heartbeats_reach_the_listener(cluster: Cluster) -> None:
    held = {"shards": 2, "own": 1, "copies": [0], "hsdp": True}
    for worker, holds in ((W0, None), (W1, held), (W0, None)):
        body = {"hostname": worker.hostname, "local_rank": worker.local_rank}
        body |= {"held_shards": holds} if holds else {}
        status, answer = await cluster.call("POST", "/v1/jobs/job-a/heartbeat", json=body)
        assert (status, answer) == (204, None)
    assert cluster.listener_a.heartbeats == [W0, W1, W0]
    assert cluster.listener_b.heartbeats == []
    assert cluster.listener_a.held_shards[1] == (W1, HeldShards.model_validate(held))


# ---- notices ---------------------------------------------------------------------------


async def notices(cluster: Cluster, query: str) -> NoticesResponse:
    status, body = await cluster.call("GET", f"/v1/jobs/job-a/notices{query}")
    assert status == 200, body
    return NoticesResponse.model_validate(body)


async def test_notices_order_filter_and_long_poll(cluster: Cluster) -> None:
    cluster.job_a.post_notice(NoticeKind.HOSTS_ADDED, ["host-b"])
    cluster.job_a.post_notice(NoticeKind.HOSTS_REMOVED, ["host-a"])
    every = await notices(cluster, "")
    assert [(n.seq, n.kind) for n in every.notices] == [
        (1, NoticeKind.HOSTS_ADDED),
        (2, NoticeKind.HOSTS_REMOVED),
    ]
    assert [n.seq for n in (await notices(cluster, "?after=1")).notices] == [2]
    assert (await until_done(notices(cluster, "?after=2&wait=0.05"))).notices == ()

    arrived = asyncio.Event()
    original = cluster.job_a.notices

    async def observed(after_seq: int, wait_seconds: float) -> NoticesResponse:
        arrived.set()
        return await original(after_seq, wait_seconds)

    cluster.job_a.notices = observed  # type: ignore[method-assign]
    poll = asyncio.create_task(notices(cluster, "?after=2&wait=60"))
    await until_done(arrived.wait())
    posted = cluster.job_a.post_notice(NoticeKind.ROUND_FAILED)
    answer = await until_done(poll)
    assert answer.notices == (posted,) and answer.latest_seq == 3


async def test_notices_capped_at_thousand(cluster: Cluster) -> None:
    for _ in range(1003):
        cluster.job_a.post_notice(NoticeKind.HOSTS_ADDED)
    kept = await notices(cluster, "?after=1")
    assert len(kept.notices) == 1000 and kept.notices[0].seq == 4
    assert kept.latest_seq == 1003


# ---- authentication and authorization --------------------------------------------------


@pytest.mark.parametrize(("method", "route", "body"), ROUTES)
@pytest.mark.parametrize("header", [None, "Basic abc", "Bearer", "Bearer ", "Bearer a b"])
async def test_missing_or_malformed_authorization_is_401(
    cluster: Cluster, method: str, route: str, body: object, header: str | None
) -> None:
    headers = {} if header is None else {"Authorization": header}
    before = snapshot(cluster.job_a, cluster.listener_a)
    status, answer = await cluster.call(
        method, f"/v1/jobs/job-a/{route}", token=None, json=body, headers=headers
    )
    assert status == 401 and "Authorization" in answer["error"]
    assert snapshot(cluster.job_a, cluster.listener_a) == before


@pytest.mark.parametrize(("method", "route", "body"), ROUTES)
@pytest.mark.parametrize("token", [TOKEN_A, "wrong-token"])
async def test_foreign_or_wrong_token_is_403_and_changes_nothing(
    cluster: Cluster, method: str, route: str, body: object, token: str
) -> None:
    cluster.job_b.post_notice(NoticeKind.HOSTS_ADDED)
    before = snapshot(cluster.job_b, cluster.listener_b)
    status, answer = await cluster.call(method, f"/v1/jobs/job-b/{route}", token=token, json=body)
    assert status == 403 and "job-b" in answer["error"]
    assert token not in str(answer)
    assert snapshot(cluster.job_b, cluster.listener_b) == before


@pytest.mark.parametrize(("method", "route", "body"), ROUTES)
async def test_unknown_job_is_403_like_a_wrong_token(
    cluster: Cluster, method: str, route: str, body: object
) -> None:
    status, answer = await cluster.call(method, f"/v1/jobs/job-c/{route}", json=body)
    wrong_status, wrong = await cluster.call(
        method, f"/v1/jobs/job-b/{route}", token="wrong-token", json=body
    )
    assert status == wrong_status == 403
    assert answer["error"] == wrong["error"].replace("job-b", "job-c"), "job names stay hidden"


# ---- malformed requests ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"surprise": 1}, "surprise"),
        ({"local_rank": -1}, "local_rank"),
        ({"hostname": "bad host!"}, "hostname"),
        ({"store_port": "many"}, "store_port"),
        ({"wait_seconds": 61}, "wait_seconds"),
    ],
)
async def test_invalid_rendezvous_body_is_422_naming_the_field(
    cluster: Cluster, change: dict[str, object], field: str
) -> None:
    before = snapshot(cluster.job_a, cluster.listener_a)
    body = rendezvous_body(W0) | change
    status, answer = await cluster.call(
        "POST", "/v1/jobs/job-a/rendezvous", token=TOKEN_A, json=body
    )
    assert status == 422 and field in answer["error"]
    assert [field] in [entry["loc"] for entry in answer["detail"]]
    assert snapshot(cluster.job_a, cluster.listener_a) == before


@pytest.mark.parametrize(
    ("route", "data", "expected"),
    [
        ("rendezvous", b"{not json", 400),
        ("rendezvous", b"", 400),
        ("rendezvous", b"[]", 422),
        ("results", b'{"hostname": "host-a", "local_rank": 0, "state": "DONE"}', 422),
        ("progress", b'{"round": 1, "epoch": -3, "step": 0}', 422),
        ("results", b'{"hostname": "host-a", "local_rank": 0, "state": "SUCCESS", "x": 1}', 422),
        ("rendezvous", b'{"a": "' + b"x" * MAX_BODY_BYTES + b'"}', 413),
        ("progress", b" " * (MAX_BODY_BYTES + 1), 413),
        ("heartbeat", b'{"hostname": "host-a"}', 422),
        ("heartbeat", b'{"hostname": "bad host!", "local_rank": 0}', 422),
        ("heartbeat", b'{"hostname": "host-a", "local_rank": 0, "step": 3}', 422),
        ("heartbeat", b"{not json", 400),
        (
            "heartbeat",
            b'{"hostname": "host-a", "local_rank": 0, "held_shards": {"shards": 2, "own": 2}}',
            422,
        ),
        (
            "heartbeat",
            b'{"hostname": "host-a", "local_rank": 0, '
            b'"held_shards": {"shards": 2, "own": 0, "hsdp": "yes"}}',
            422,
        ),
        ("exits", b'{"hostname": "host-a", "local_rank": 0, "exit_code": 300}', 422),
        ("exits", b'{"hostname": "host-a", "local_rank": 0, "exit_code": "9"}', 422),
        ("exits", b'{"hostname": "host-a", "local_rank": 0}', 422),
    ],
)
async def test_malformed_body_is_4xx_and_changes_nothing(
    cluster: Cluster, route: str, data: bytes, expected: int
) -> None:
    before = snapshot(cluster.job_a, cluster.listener_a)
    status, answer = await cluster.call(
        "POST", f"/v1/jobs/job-a/{route}", data=data, headers={"Content-Type": "application/json"}
    )
    assert status == expected and answer["error"]
    assert snapshot(cluster.job_a, cluster.listener_a) == before


async def test_chunked_body_over_limit_is_413(cluster: Cluster) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(5):
            yield b" " * (MAX_BODY_BYTES // 4)

    status, answer = await cluster.call("POST", "/v1/jobs/job-a/rendezvous", data=chunks())
    assert status == 413 and str(MAX_BODY_BYTES) in answer["error"]
    assert cluster.listener_a.ready == []


@pytest.mark.parametrize(
    ("query", "expected", "field"),
    [
        ("?after=-1", 422, "after"),
        ("?wait=61", 422, "wait"),
        ("?wait=nan", 422, "wait"),
        ("?wait=soon", 422, "wait"),
        ("?since=3", 422, "since"),
        ("?after=1&after=2", 400, "after"),
    ],
)
async def test_invalid_notices_query(
    cluster: Cluster, query: str, expected: int, field: str
) -> None:
    status, answer = await cluster.call("GET", f"/v1/jobs/job-a/notices{query}")
    assert status == expected and field in answer["error"]


async def test_401_names_the_bearer_scheme(cluster: Cluster) -> None:
    async with cluster.session.get(cluster.service.url + "/v1/jobs/job-a/round") as response:
        assert response.status == 401
        assert response.headers["WWW-Authenticate"] == "Bearer"
        assert response.content_type == "application/json"


async def test_start_twice_or_after_stop_is_refused(cluster: Cluster) -> None:
    with pytest.raises(RuntimeError, match="only once"):
        await cluster.service.start("127.0.0.1")


async def test_wrong_method_and_unknown_path(cluster: Cluster) -> None:
    status, answer = await cluster.call("GET", "/v1/jobs/job-a/rendezvous")
    assert status == 405 and answer["error"]
    async with cluster.session.delete(cluster.service.url + "/v1/jobs/job-a/round") as response:
        assert response.status == 405 and response.headers["Allow"] == "GET"
    status, answer = await cluster.call("GET", "/v1/nothing-here")
    assert status == 404 and answer["error"]


async def test_request_stats(cluster: Cluster) -> None:
    await cluster.call("GET", "/v1/jobs/job-a/round")
    await cluster.call("GET", "/v1/jobs/job-a/round", token=None)
    stats = cluster.service.stats.snapshot()["GET /v1/jobs/{job}/round"]
    assert (stats.requests, stats.errors, dict(stats.by_status)) == (2, 1, {200: 1, 401: 1})
    assert stats.timed == 2 and sum(stats.latency_buckets) == 2
    assert stats.latency_seconds_sum > 0


async def test_long_polls_are_counted_but_left_out_of_the_latency(cluster: Cluster) -> None:
    status, _ = await cluster.call("GET", "/v1/jobs/job-a/notices?after=0&wait=0.3")
    assert status == 200
    status, _ = await cluster.call("GET", "/v1/jobs/job-a/notices?after=0")
    assert status == 200
    stats = cluster.service.stats.snapshot()["GET /v1/jobs/{job}/notices"]
    assert (stats.requests, stats.timed, sum(stats.latency_buckets)) == (2, 1, 1)
    assert stats.latency_seconds_sum < 0.3, "the long-poll's wait is not in the latency"


# ---- service lifecycle -----------------------------------------------------------------


async def test_stop_answers_pending_long_polls_promptly() -> None:
    service = RendezvousService()
    await service.start("127.0.0.1")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=90)) as session:
        cluster = Cluster(service, session)
        arrived = asyncio.Event()
        original = cluster.job_a.notices

        async def observed(after_seq: int, wait_seconds: float) -> NoticesResponse:
            arrived.set()
            return await original(after_seq, wait_seconds)

        cluster.job_a.notices = observed  # type: ignore[method-assign]
        waiter = asyncio.create_task(cluster.rendezvous(W0, wait=60))
        poll = asyncio.create_task(notices(cluster, "?wait=60"))
        await until_done(asyncio.gather(cluster.listener_a.ready_event.wait(), arrived.wait()))
        await until_done(service.stop())
        assert (await until_done(waiter)).status is RendezvousStatus.PENDING
        assert (await until_done(poll)).notices == ()
    assert not cluster.job_a.finished


async def test_add_job_refuses_duplicates_and_bad_names(cluster: Cluster) -> None:
    with pytest.raises(ValueError, match="already exists"):
        cluster.service.add_job("job-a", "other", RecordingListener())
    with pytest.raises(ValueError, match="invalid job name"):
        cluster.service.add_job("Job_A", "other", RecordingListener())
    status, _ = await cluster.call("GET", "/v1/jobs/job-a/round")
    assert status == 200, "the job served first is still served"
    cluster.service.remove_job("never-added")


# ---- API document ----------------------------------------------------------------------


def registered_routes(service: RendezvousService) -> set[tuple[str, str]]:
    return {
        (route.method.lower(), route.resource.canonical)
        for route in service.app.router.routes()
        if route.resource is not None
    }


def test_openapi_document_lists_every_route_and_wire_model() -> None:
    document = yaml.safe_load(OPENAPI.read_text())
    assert document["openapi"].startswith("3.0")
    assert document["info"]["version"] == str(PROTOCOL_VERSION)
    documented = {
        (method, path)
        for path, item in document["paths"].items()
        for method in item
        if method != "parameters"
    }
    assert documented == registered_routes(RendezvousService())
    assert document["components"]["securitySchemes"]["bearerAuth"]["scheme"] == "bearer"

    schemas = document["components"]["schemas"]
    models: list[type[BaseModel]] = [
        RendezvousRequest,
        HeldShards,
        ExitReport,
        ExitAnswer,
        RendezvousResponse,
        SlotInfo,
        Notice,
        NoticesResponse,
        ResultRequest,
        ProgressRequest,
        CheckpointReport,
        HeartbeatRequest,
        RoundInfo,
        PlannedRound,
        ErrorResponse,
        CohortRequest,
        CohortResponse,
        HealthFigures,
        HealthReport,
        HealthVerdict,
    ]
    for model in models:
        schema = schemas[model.__name__]
        assert set(schema["properties"]) == set(model.model_fields), model.__name__
        required = {name for name, info in model.model_fields.items() if info.is_required()}
        assert set(schema.get("required", [])) == required, model.__name__
    for enum in (WorkerState, NoticeKind, RendezvousStatus, HealthProblem, VerdictStatus):
        assert schemas[enum.__name__]["enum"] == [member.value for member in enum]


def test_openapi_refs_resolve() -> None:
    document = yaml.safe_load(OPENAPI.read_text())

    def refs(node: object) -> list[str]:
        if isinstance(node, dict):
            own = [node["$ref"]] if "$ref" in node else []
            return own + [ref for value in node.values() for ref in refs(value)]
        if isinstance(node, list):
            return [ref for value in node for ref in refs(value)]
        return []

    for ref in refs(document):
        target: Any = document
        for part in ref.removeprefix("#/").split("/"):
            target = target[part]
        assert isinstance(target, dict), ref
