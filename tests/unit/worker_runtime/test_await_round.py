"""``RendezvousClient.await_round``, the long poll both the elastic runtime and the restart
agent join rounds with, against a small HTTP server that answers from a script: PENDING is
asked again (with the same request, each try waiting ``LONG_POLL_S`` at the service), any
other answer ends the wait, a passed deadline raises, a stop ends it quietly."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator

import pytest

from elasticjob.wire.messages import RendezvousRequest, RendezvousStatus
from elasticjob.worker_runtime.link.rendezvous_client import LONG_POLL_S, RendezvousClient

REQUEST = RendezvousRequest(
    hostname="host-a", local_rank=1, address="127.0.0.1", store_port=29500, after_round=4
)


class Scripted(http.server.ThreadingHTTPServer):
    """Answers each rendezvous request with the next status of ``answers`` (the last one
    forever) and keeps the requests it got."""

    def __init__(self, answers: list[RendezvousStatus]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.answers = answers
        self.requests: list[dict[str, object]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: Scripted

    def do_POST(self) -> None:
        self.server.requests.append(
            json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        )
        answers = self.server.answers
        status = answers.pop(0) if len(answers) > 1 else answers[0]
        body = json.dumps({"status": status.value, "message": "scripted"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def serve() -> Iterator[list[Scripted]]:
    servers: list[Scripted] = []
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


def client_of(
    serve: list[Scripted], *answers: RendezvousStatus
) -> tuple[RendezvousClient, Scripted]:
    server = Scripted(list(answers))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    serve.append(server)
    return RendezvousClient(server.url, "job-a", "token", retry_deadline_s=5.0), server


@pytest.mark.parametrize("final", [RendezvousStatus.REMOVED, RendezvousStatus.FINISHED])
def test_pending_is_asked_again_until_another_answer(
    serve: list[Scripted], final: RendezvousStatus
) -> None:
    client, server = client_of(serve, RendezvousStatus.PENDING, RendezvousStatus.PENDING, final)
    response = client.await_round(REQUEST, deadline=time.monotonic() + 10)
    assert response is not None and response.status is final
    assert len(server.requests) == 3
    assert {(r["after_round"], r["wait_seconds"]) for r in server.requests} == {(4, LONG_POLL_S)}


def test_a_passed_deadline_raises_naming_the_worker(serve: list[Scripted]) -> None:
    client, server = client_of(serve, RendezvousStatus.PENDING)
    with pytest.raises(RuntimeError, match=r"no round after round 4 .* to host-a\[1\]"):
        client.await_round(REQUEST, deadline=time.monotonic() + 0.3)
    assert server.requests, "it asked until the deadline"


def test_a_stop_ends_the_wait_between_tries(serve: list[Scripted]) -> None:
    client, server = client_of(serve, RendezvousStatus.PENDING)
    tries = iter([False, False, True])
    response = client.await_round(
        REQUEST, deadline=time.monotonic() + 10, stopped=lambda: next(tries)
    )
    assert response is None
    assert len(server.requests) == 2
