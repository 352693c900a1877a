"""The wire is strict: integers are JSON integers, booleans are booleans, keys appear once."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel, ValidationError

from elasticjob import wire

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
        (wire.RendezvousRequest, RENDEZVOUS, "local_rank", True),
        (wire.RendezvousRequest, RENDEZVOUS, "local_rank", "1"),
        (wire.RendezvousRequest, RENDEZVOUS, "local_rank", 1.0),
        (wire.RendezvousRequest, RENDEZVOUS, "store_port", "29500"),
        (wire.RendezvousRequest, RENDEZVOUS, "after_round", 2.0),
        (wire.RendezvousRequest, RENDEZVOUS, "after_round", False),
        (wire.RendezvousRequest, RENDEZVOUS, "wait_seconds", "1.5"),
        (wire.RendezvousRequest, RENDEZVOUS, "wait_seconds", True),
        (wire.RendezvousRequest, RENDEZVOUS, "rolled_back", 1),
        (wire.RendezvousRequest, RENDEZVOUS, "rolled_back", "true"),
        (wire.HeartbeatRequest, {"hostname": "h", "local_rank": 0}, "local_rank", True),
        (wire.ProgressRequest, {"round": 1, "epoch": 0, "step": 0}, "step", 3.0),
        (wire.ProgressRequest, {"round": 1, "epoch": 0, "step": 0}, "round", "1"),
        (
            wire.ResultRequest,
            {"hostname": "h", "local_rank": 0, "state": "SUCCESS"},
            "exit_code",
            True,
        ),
    ],
)
def test_lax_values_are_refused(
    model: type[BaseModel], body: dict[str, object], field: str, value: object
) -> None:
    wire.parse_json(model, json.dumps(body))  # the valid body passes
    with pytest.raises(ValidationError) as caught:
        wire.parse_json(model, json.dumps(body | {field: value}))
    assert caught.value.errors()[0]["loc"] == (field,)


def test_floats_take_json_integers() -> None:
    request = wire.parse_json(wire.RendezvousRequest, json.dumps(RENDEZVOUS | {"wait_seconds": 2}))
    assert request.wait_seconds == 2.0


def test_python_callers_cannot_pass_lax_values_either() -> None:
    with pytest.raises(ValidationError):
        wire.HeartbeatRequest(hostname="h", local_rank=True)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "data",
    [
        b'{"hostname": "h", "local_rank": 0, "local_rank": 1}',
        b'{"round": 1, "epoch": 0, "step": 0, "round": 0}',
    ],
)
def test_repeated_keys_are_refused(data: bytes) -> None:
    model = wire.HeartbeatRequest if b"hostname" in data else wire.ProgressRequest
    with pytest.raises(wire.DuplicateKeyError, match="more than once"):
        wire.parse_json(model, data)


def test_responses_are_parsed_strictly_too() -> None:
    answer = wire.parse_json(wire.RendezvousResponse, b'{"status": "PENDING", "sync": false}')
    assert answer.status is wire.RendezvousStatus.PENDING
    with pytest.raises(ValidationError):
        wire.parse_json(wire.RendezvousResponse, b'{"status": "PENDING", "round": "3"}')
