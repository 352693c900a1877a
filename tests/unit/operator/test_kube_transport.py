"""How the operator's API calls fail: the client's connection failures that are no OSError
become one (every caller treats them as transient), and a one-try call is bounded in time,
the wait for a thread included."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import urllib3

from elasticjob.operator.kube_transport import KubeTransport

DEADLINE_S = 5.0


def refused(*_args: Any, **_kwargs: Any) -> Any:
    raise urllib3.exceptions.MaxRetryError(None, "/api", reason="connection refused")  # type: ignore[arg-type]


async def test_urllib3_failures_are_connection_errors() -> None:
    transport = KubeTransport(attempts=1, threads=1, http_retries=False)
    with pytest.raises(ConnectionError, match="connection refused"):
        await transport.call("read", refused)
    with pytest.raises(ConnectionError):
        await transport.call_once("read", refused, timeout_s=DEADLINE_S)


async def test_a_one_try_call_gives_up_at_its_timeout_even_waiting_for_a_thread() -> None:
    transport = KubeTransport(attempts=1, threads=1, http_retries=False)
    release = threading.Event()

    def blocking(*_args: Any, **_kwargs: Any) -> Any:
        release.wait(DEADLINE_S)
        raise AssertionError("not reached in time")

    occupied = asyncio.create_task(transport.call_once("busy", blocking, timeout_s=DEADLINE_S))
    await asyncio.sleep(0.05)  # the pool's one thread is taken
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await transport.call_once("queued", refused, timeout_s=0.2)
    assert time.monotonic() - started < 1.0
    release.set()
    await asyncio.gather(occupied, return_exceptions=True)
