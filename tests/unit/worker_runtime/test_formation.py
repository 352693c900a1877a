"""Forming a round's group gives up as soon as the round fails, instead of waiting out the
collective timeout for a member that never comes (real TCPStore servers on loopback)."""

from __future__ import annotations

import datetime
import threading
import time

import pytest
from torch.distributed import TCPStore

from elasticjob.worker_runtime.exceptions import HorovodInternalError
from elasticjob.worker_runtime.rounds.group_formation import await_members, connect_store
from tests.support.loopback import closed_port

MINUTE = datetime.timedelta(seconds=60)


def server() -> TCPStore:
    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=MINUTE)


def never() -> bool:
    return False


def test_members_that_all_arrive_go_on() -> None:
    master = server()
    client = connect_store("127.0.0.1", master.port, MINUTE, never)
    other = threading.Thread(target=await_members, args=(client, "job/round-1/", 2, MINUTE, never))
    other.start()
    await_members(master, "job/round-1/", 2, MINUTE, never)
    other.join(10)
    assert not other.is_alive()


def test_a_member_that_never_comes_is_given_up_on_once_the_round_fails() -> None:
    master = server()
    failed = threading.Event()
    threading.Timer(0.5, failed.set).start()  # the driver's ROUND_FAILED notice
    started = time.monotonic()
    with pytest.raises(HorovodInternalError, match="failed before it formed"):
        await_members(master, "job/round-2/", 2, MINUTE, failed.is_set)
    assert time.monotonic() - started < MINUTE.total_seconds() / 6  # long before the timeout


def test_without_a_failure_the_wait_ends_at_the_timeout() -> None:
    master = server()
    with pytest.raises(HorovodInternalError, match="not every member"):
        await_members(master, "job/round-3/", 2, datetime.timedelta(seconds=0.6), never)


def test_an_unreachable_store_is_given_up_on_once_the_round_fails() -> None:
    failed = threading.Event()
    threading.Timer(0.5, failed.set).start()
    started = time.monotonic()
    with pytest.raises(HorovodInternalError, match="failed before it formed"):
        connect_store("127.0.0.1", closed_port(), MINUTE, failed.is_set)
    assert time.monotonic() - started < MINUTE.total_seconds() / 6  # long before the timeout


def test_the_connected_client_keeps_the_rounds_timeout() -> None:
    master = server()
    client = connect_store("127.0.0.1", master.port, MINUTE, never)
    assert client.timeout == MINUTE
