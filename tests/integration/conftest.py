"""What the integration tests share: one shared start server for every launcher a test runs
(``elasticjob-run --start-server``, through ``ELASTICJOB_START_SERVER``), so that each job's
workers fork from an interpreter that imported torch once for the session instead of once
per job. A job whose environment it does not serve starts a server of its own, as without
it; the per-job server is ``tests/unit/launcher/test_warm_workers.py``'s."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from elasticjob.launcher.warm_workers import START_SERVER_ENV
from tests.support.cpu_report import count_process
from tests.support.start_servers import shared_start_server


@pytest.fixture(scope="session", autouse=True)
def _shared_start_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    socket_path = tmp_path_factory.mktemp("starts") / "starts.sock"
    with shared_start_server(socket_path) as server, pytest.MonkeyPatch.context() as patch:
        count_process(server.pid)  # the workers it forks count in the tests' CPU
        patch.setenv(START_SERVER_ENV, str(socket_path))
        yield
