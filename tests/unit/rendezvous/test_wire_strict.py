"""The wire is strict: integers are JSON integers, booleans are booleans, keys appear once."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, ValidationError

from elasticjob.wire.messages import (
    ExitAnswer,
    HeartbeatRequest,
    ProbedPeer,
    ProgressRequest,
    RendezvousRequest,
    RendezvousResponse,
    RendezvousStatus,
    ResultRequest,
)
from elasticjob.wire.strict_json import DuplicateKeyError, parse_json

RENDEZVOUS = {
    "hostname": "host-a",
    "local_rank": 0,
    "address": "10.0.0.1",
    "store_port": 29500,
    "after_round": 0,
    "wait_seconds": 1.5,
    "rolled_back": False,
}


@pytest.mark.parametrize(
    ("model", "body", "field", "value"),
    [
        (RendezvousRequest, RENDEZVOUS, "local_rank", True),
        (RendezvousRequest, RENDEZVOUS, "local_rank", "1"),
        (RendezvousRequest, RENDEZVOUS, "local_rank", 1.0),
        (RendezvousRequest, RENDEZVOUS, "store_port", "29500"),
        (RendezvousRequest, RENDEZVOUS, "after_round", 2.0),
        (RendezvousRequest, RENDEZVOUS, "after_round", False),
        (RendezvousRequest, RENDEZVOUS, "wait_seconds", "1.5"),
        (RendezvousRequest, RENDEZVOUS, "wait_seconds", True),
        (RendezvousRequest, RENDEZVOUS, "rolled_back", 1),
        (RendezvousRequest, RENDEZVOUS, "rolled_back", "true"),
        (HeartbeatRequest, {"hostname": "h", "local_rank": 0}, "local_rank", True),
        (HeartbeatRequest, {"hostname": "h", "local_rank": 0}, "round", "1"),
        (HeartbeatRequest, {"hostname": "h", "local_rank": 0}, "round", True),
        (HeartbeatRequest, {"hostname": "h", "local_rank": 0}, "round", -1),
        (HeartbeatRequest, {"hostname": "h", "local_rank": 0, "round": 1}, "unreachable", 3),
        (
            HeartbeatRequest,
            {"hostname": "h", "local_rank": 0, "round": 1},
            "unreachable",
            [{"hostname": "p", "local_rank": 0}] * 4,
        ),
        (ProgressRequest, {"round": 1, "epoch": 0, "step": 0}, "step", 3.0),
        (ProgressRequest, {"round": 1, "epoch": 0, "step": 0}, "round", "1"),
        (
            ResultRequest,
            {"hostname": "h", "local_rank": 0, "state": "SUCCESS"},
            "exit_code",
            True,
        ),
    ],
)
def test_lax_values_are_refused(
    model: type[BaseModel], body: dict[str, object], field: str, value: object
) -> None:
    parse_json(model, json.dumps(body))  # the valid body passes
    with pytest.raises(ValidationError) as caught:
        parse_json(model, json.dumps(body | {field: value}))
    assert caught.value.errors()[0]["loc"] == (field,)


def test_floats_take_json_integers() -> None:
    request = parse_json(RendezvousRequest, json.dumps(RENDEZVOUS | {"wait_seconds": 2}))
    assert request.wait_seconds == 2.0


def test_python_callers_cannot_pass_lax_values_either() -> None:
    with pytest.raises(ValidationError):
        HeartbeatRequest(hostname="h", local_rank=True)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "data",
    [
        b'{"hostname": "h", "local_rank": 0, "local_rank": 1}',
        b'{"round": 1, "epoch": 0, "step": 0, "round": 0}',
    ],
)
def test_repeated_keys_are_refused(data: bytes) -> None:
    model = HeartbeatRequest if b"hostname" in data else ProgressRequest
    with pytest.raises(DuplicateKeyError, match="more than once"):
        parse_json(model, data)


def test_responses_are_parsed_strictly_too() -> None:
    answer = parse_json(RendezvousResponse, b'{"status": "PENDING", "sync": false}')
    assert answer.status is RendezvousStatus.PENDING
    with pytest.raises(ValidationError):
        parse_json(RendezvousResponse, b'{"status": "PENDING", "round": "3"}')


PEER = {"hostname": "peer", "local_rank": 1}


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"unreachable": [PEER]}, "with the round"),
        ({"round": 2, "unreachable": [PEER, PEER]}, "more than once"),
        ({"round": 2, "unreachable": [PEER | {"local_rank": "1"}]}, "valid integer"),
        ({"round": 2, "unreachable": [PEER | {"hostname": "-bad"}]}, "pattern"),
        ({"round": 2, "unreachable": [PEER | {"port": 1}]}, "Extra inputs"),
        ({"round": 2, "unreachable": [None]}, "should be an object"),
    ],
)
def test_malformed_probe_reports_are_refused(body: dict[str, object], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        parse_json(HeartbeatRequest, json.dumps({"hostname": "h", "local_rank": 0} | body))


def test_a_probe_report_and_a_plain_beat_are_valid() -> None:
    plain = parse_json(HeartbeatRequest, b'{"hostname": "h", "local_rank": 0}')
    assert (plain.round, plain.unreachable) == (None, ())
    body = {"hostname": "h", "local_rank": 0, "round": 4, "unreachable": [PEER]}
    report = parse_json(HeartbeatRequest, json.dumps(body))
    assert report.round == 4 and report.unreachable == (ProbedPeer(**PEER),)  # type: ignore[arg-type]


def test_a_response_carries_at_most_three_peers() -> None:
    peer = {"hostname": "p", "local_rank": 0, "address": "10.0.0.2", "store_port": 29500}
    parse_json(RendezvousResponse, json.dumps({"status": "ASSIGNED", "peers": [peer] * 3}))
    with pytest.raises(ValidationError, match="at most 3"):
        parse_json(RendezvousResponse, json.dumps({"status": "ASSIGNED", "peers": [peer] * 4}))


@pytest.mark.parametrize(
    ("held", "problem"),
    [
        ({"shards": 4, "own": 4}, "not all among 4 shards"),
        ({"shards": 4, "own": 1, "copies": [0, 5]}, "not all among 4 shards"),
        ({"shards": 4, "own": 1, "copies": [1]}, "named twice"),
        ({"shards": 4, "own": 1, "copies": [2, 2]}, "named twice"),
        ({"shards": 0, "own": 0}, "greater than or equal to 1"),
        ({"shards": 4, "own": -1}, "greater than or equal to 0"),
        ({"shards": 4, "own": "1"}, "valid integer"),
        ({"shards": 99, "own": 0, "copies": list(range(1, 66))}, "at most 64"),
        ({"shards": 4, "own": 0, "rows": 3}, "Extra inputs"),
        ({"shards": 4, "own": 0, "hsdp": "true"}, "valid boolean"),
        ({"shards": 4, "own": 0, "hsdp": 1}, "valid boolean"),
    ],
)
def test_malformed_held_shards_are_refused(held: dict[str, object], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        parse_json(RendezvousRequest, json.dumps(RENDEZVOUS | {"held_shards": held}))


def test_a_request_says_what_it_holds_of_a_sharded_state() -> None:
    assert parse_json(RendezvousRequest, json.dumps(RENDEZVOUS)).held_shards is None
    body = RENDEZVOUS | {"held_shards": {"shards": 4, "own": 2, "copies": [1]}}
    held = parse_json(RendezvousRequest, json.dumps(body)).held_shards
    assert held is not None and held.held == (2, 1) and not held.hsdp


def test_an_answer_to_a_pods_report_says_whether_to_restart_its_slot() -> None:
    answer = parse_json(ExitAnswer, json.dumps({"restart": True, "reason": "why"}))
    assert answer.restart and answer.reason == "why"
    for bad, problem in (({}, "Field required"), ({"restart": "no"}, "valid boolean")):
        with pytest.raises(ValidationError, match=problem):
            parse_json(ExitAnswer, json.dumps(bad))
