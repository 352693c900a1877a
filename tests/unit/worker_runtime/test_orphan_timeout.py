"""A worker whose rendezvous service stays unreachable for its orphan timeout (its launcher or
operator is gone) is told so by its heartbeat thread; until then it keeps running."""

from __future__ import annotations

import http.server
import threading
import time

from elasticjob.worker_contract import ENV_ORPHAN_TIMEOUT, WorkerConfig
from elasticjob.worker_runtime.link.heartbeat import Heartbeat
from elasticjob.worker_runtime.link.rendezvous_client import RendezvousClient
from tests.support.loopback import closed_port
from tests.support.worker_env import FULL_ENV

DEADLINE_S = 20.0


def test_the_orphan_timeout_comes_from_the_environment() -> None:
    config = WorkerConfig.from_env(FULL_ENV | {ENV_ORPHAN_TIMEOUT: "7.5"})
    assert config is not None and config.orphan_timeout_s == 7.5
    default = WorkerConfig.from_env(FULL_ENV)
    assert default is not None and default.orphan_timeout_s == 900.0, "outlasts a restart"


class _Accepting(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def watch(
    url: str, orphan_timeout_s: float, interval_s: float = 0.05
) -> tuple[Heartbeat, threading.Event, list[float]]:
    orphaned = threading.Event()
    silences: list[float] = []

    def on_orphaned(silent_s: float) -> None:
        silences.append(silent_s)
        orphaned.set()

    client = RendezvousClient(url, "demo", "secret", connect_timeout_s=1.0)
    heartbeat = Heartbeat(
        client,
        "127.0.1.7",
        0,
        interval_s,
        orphan_timeout_s=orphan_timeout_s,
        on_orphaned=on_orphaned,
    )
    return heartbeat, orphaned, silences


def test_an_unreachable_rendezvous_orphans_the_worker_after_the_timeout() -> None:
    heartbeat, orphaned, silences = watch(f"http://127.0.0.1:{closed_port()}", 0.5)
    started = time.monotonic()
    heartbeat.start()
    assert orphaned.wait(DEADLINE_S), "never told it is orphaned"
    assert time.monotonic() - started >= 0.5
    assert silences and silences[0] >= 0.5


def test_beats_that_arrive_keep_the_worker_until_the_service_goes() -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Accepting)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    # A 2 s timeout, beats every 50 ms: only a machine stalled for seconds misses 40 beats.
    heartbeat, orphaned, _ = watch(f"http://127.0.0.1:{server.server_address[1]}", 2.0)
    heartbeat.start()
    try:
        assert not orphaned.wait(3.0), "orphaned while its beats arrived"
    finally:
        server.shutdown()
        server.server_close()
    gone = time.monotonic()
    assert orphaned.wait(DEADLINE_S), "not orphaned once the service went"
    assert time.monotonic() - gone >= 1.5


def test_no_orphan_timeout_means_never_orphaned() -> None:
    heartbeat, orphaned, _ = watch(f"http://127.0.0.1:{closed_port()}", 0.0, interval_s=0.2)
    heartbeat.start()
    try:
        assert not orphaned.wait(1.0)
    finally:
        heartbeat.stop()  # it would beat on for the rest of the test run
