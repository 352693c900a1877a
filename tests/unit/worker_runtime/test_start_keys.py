"""What the restart mode's agents of one start tell each other through its store (real TCPStore
servers on loopback): a restart that follows wakes every other agent at once, the exit barrier
wakes rank 0's once every other script ended, an agent's own release wakes nobody, and a
store that cannot be reached holds an agent up for a bounded time only. The agent's waits are
woken by events, a signal handler's among them (``Wakeups``)."""

from __future__ import annotations

import datetime
import signal
import threading
import time
from collections.abc import Iterator

import pytest
from torch.distributed import TCPStore

from elasticjob.worker_runtime.agents.restart_agent import Wakeups
from elasticjob.worker_runtime.agents.start_keys import CONNECT_S, StartKeys
from elasticjob.worker_runtime.rounds.joiner import serve_store
from tests.support.loopback import closed_port

WOKEN_WITHIN_S = 30.0
NOT_WOKEN_S = 0.5


class Agent:
    """One agent's keys, and an event for its wake-ups."""

    def __init__(self, server: TCPStore, rank: int, size: int) -> None:
        self.woken = threading.Event()
        master = ("127.0.0.1", server.port)
        self.keys = StartKeys(server, rank, size, master, self.woken.set)


@pytest.fixture
def start() -> Iterator[list[Agent]]:
    """Three agents of one start; rank 0 serves the store."""
    server = serve_store("127.0.0.1", datetime.timedelta(seconds=60))
    agents = [Agent(server, rank, 3) for rank in range(3)]
    yield agents
    for agent in agents:
        agent.keys.close()


def test_a_restart_that_follows_wakes_every_other_agent(start: list[Agent]) -> None:
    rank0, rank1, rank2 = start
    rank2.keys.announce_restart()
    for agent in (rank0, rank1):
        assert agent.woken.wait(WOKEN_WITHIN_S)
        assert agent.keys.restart_follows and not agent.keys.all_ended


def test_rank_0_is_woken_once_every_other_script_ended(start: list[Agent]) -> None:
    rank0, rank1, rank2 = start
    rank1.keys.script_succeeded()
    assert not rank0.woken.wait(NOT_WOKEN_S), "rank 2's script has not ended yet"
    rank2.keys.script_succeeded()
    assert rank0.woken.wait(WOKEN_WITHIN_S)
    assert rank0.keys.all_ended and not rank0.keys.restart_follows
    assert not rank1.woken.is_set() and not rank2.woken.is_set()


def test_an_agent_releasing_its_own_wait_wakes_nobody(start: list[Agent]) -> None:
    deadline = time.monotonic() + WOKEN_WITHIN_S
    while not all(a.keys._watching.is_set() for a in start) and time.monotonic() < deadline:
        time.sleep(0.01)  # the watchers connect on threads of their own
    for agent in start:
        agent.keys.close()
    assert not any(a.woken.wait(NOT_WOKEN_S) for a in start)


def test_a_store_that_cannot_be_reached_holds_the_agent_up_briefly() -> None:
    server = serve_store("127.0.0.1", datetime.timedelta(seconds=60))
    woken = threading.Event()
    keys = StartKeys(server, 1, 2, ("127.0.0.1", closed_port()), woken.set)
    started = time.monotonic()
    keys.announce_restart()
    keys.close()
    assert time.monotonic() - started < CONNECT_S + 5.0
    assert not woken.is_set()


def test_a_signal_handler_wakes_the_agents_wait() -> None:
    wakeups = Wakeups()
    previous = signal.signal(signal.SIGALRM, lambda _signum, _frame: wakeups.set())
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        started = time.monotonic()
        wakeups.wait(started + WOKEN_WITHIN_S)
        assert time.monotonic() - started < WOKEN_WITHIN_S / 2
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_wait_without_a_wakeup_ends_at_its_deadline() -> None:
    wakeups = Wakeups()
    wakeups.set()
    wakeups.clear()  # a wake-up seen before looking does not end the next wait
    started = time.monotonic()
    wakeups.wait(started + 0.3)
    assert 0.25 <= time.monotonic() - started < WOKEN_WITHIN_S
