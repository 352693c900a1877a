"""Tearing down a round's group never waits for a collective it abandoned (real Gloo groups
over loopback, the peer a second process).

The peer (``silent_peer`` of ``conftest.py``) forms the group, then never enters the
collective and never closes its sockets: what survivors see of a member cut off by the network
(no reset ever comes). Gloo's threads wait for it until the group's timeout; the next round
must not.
"""

from __future__ import annotations

import datetime
import gc
import subprocess
import threading
import time

import pytest
import torch
import torch.distributed as dist
from torch.distributed import HashStore

from elasticjob.worker_runtime.collectives import lingering
from elasticjob.worker_runtime.exceptions import HorovodInternalError
from elasticjob.worker_runtime.rounds.process_group import RoundGroup

TIMEOUT = datetime.timedelta(seconds=40)
TEARDOWN_THREAD = "abandoned-group-teardown"


def blocked_collective(group: RoundGroup) -> tuple[threading.Thread, list[BaseException]]:
    """An allreduce the silent peer never joins, waited on in a thread; returns once the
    thread is blocked in it."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            group.wait(dist.all_reduce(torch.ones(4096), async_op=True))
        except HorovodInternalError as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 10
    while (group.blocked_for() or 0.0) < 0.2:
        assert time.monotonic() < deadline, "the collective never blocked"
        time.sleep(0.02)
    return thread, errors


def teardown_threads() -> set[threading.Thread]:
    """The threads releasing abandoned groups, alive now: a test counts those it did not find
    at its start (an earlier test's abandoned group may still be released)."""
    return {t for t in threading.enumerate() if t.name == TEARDOWN_THREAD}


def test_an_aborted_group_is_torn_down_without_waiting_for_its_abandoned_collective(
    group: RoundGroup, silent_peer: subprocess.Popen[str]
) -> None:
    earlier = teardown_threads()
    thread, errors = blocked_collective(group)
    group.abort("a member of round 1 failed")
    thread.join(5)
    assert not thread.is_alive() and errors, "the abort did not wake the collective"
    assert group.abandoned == 1

    started = time.monotonic()
    group.destroy()
    assert time.monotonic() - started < 5.0, "the teardown waited for the abandoned collective"

    # The next round forms at once and works, while the old group's threads still wait.
    group.configure(HashStore(), "round-2/", 0, 1, TIMEOUT)
    total = torch.ones(3)
    group.wait(dist.all_reduce(total, async_op=True))
    assert total.tolist() == [1.0, 1.0, 1.0]
    assert teardown_threads() - earlier, (
        "the abandoned group was released before its collective ended"
    )
    # A process leaving now would wait for the teardown (native teardown under it aborts).
    assert not lingering.settle(0.1), "the teardown thread is not counted as lingering"

    # Once the peer is gone its connections reset: the old group is released, nothing leaks.
    silent_peer.kill()
    assert lingering.settle(30.0), "the abandoned group was never released"
    deadline = time.monotonic() + 30
    while teardown_threads() - earlier or group.abandoned:
        assert time.monotonic() < deadline, "the abandoned group was never released"
        time.sleep(0.05)


def test_a_collective_abandoned_on_the_negotiated_group_never_blocks_the_teardown(
    group: RoundGroup, silent_peer: subprocess.Popen[str]
) -> None:
    """An agreed collective in flight on the negotiated group when the round breaks: the
    group's last reference is the teardown thread's. Dropped on the training thread, the
    group's destructor waits there for the collective, for as long as the peer is silent
    (seen in the end-to-end freeze and partition tests: a survivor stuck in its reset)."""
    earlier = teardown_threads()
    negotiation = group.negotiation
    errors: list[BaseException] = []

    def run(negotiated: dist.ProcessGroup) -> None:
        try:
            group.wait(dist.all_reduce(torch.ones(4096), group=negotiated, async_op=True))
        except HorovodInternalError as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, args=(negotiation.group,))
    thread.start()
    deadline = time.monotonic() + 10
    while (group.blocked_for() or 0.0) < 0.2:
        assert time.monotonic() < deadline, "the collective never blocked"
        time.sleep(0.02)
    group.abort("a member of round 1 failed")
    thread.join(5)
    assert not thread.is_alive() and errors, "the abort did not wake the collective"

    started = time.monotonic()
    group.destroy()
    with pytest.raises(RuntimeError, match="round has ended"):
        negotiation.group  # noqa: B018 - closed: it holds the group no longer
    del negotiation
    gc.collect()
    assert time.monotonic() - started < 5.0, "the teardown waited for the abandoned collective"
    silent_peer.kill()
    deadline = time.monotonic() + 30
    while teardown_threads() - earlier:
        assert time.monotonic() < deadline, "the abandoned group was never released"
        time.sleep(0.05)


def test_a_healthy_group_is_destroyed_in_place(group: RoundGroup) -> None:
    earlier = teardown_threads()
    group.configure(HashStore(), "round-1/", 0, 1, TIMEOUT)
    group.destroy()
    assert not dist.is_initialized()
    assert not teardown_threads() - earlier


# ---- futures for collectives torch waits on (DDP comm hooks) -------------------------------


def test_a_future_fails_at_once_when_the_group_is_aborted(
    group: RoundGroup, silent_peer: subprocess.Popen[str]
) -> None:
    future = group.future(dist.all_reduce(torch.ones(4096), async_op=True))
    assert group.blocked_for() is not None, "a pending future counts as blocking"
    assert not future.done()
    group.abort("a member of round 1 failed")
    assert future.done()
    with pytest.raises(HorovodInternalError, match="a member of round 1 failed"):
        future.wait()
    assert group.blocked_for() is None
    assert group.abandoned == 1
    silent_peer.kill()
    deadline = time.monotonic() + 30
    while group.abandoned:  # the work ends once the peer's connections reset
        assert time.monotonic() < deadline, "the abandoned collective never ended"
        time.sleep(0.05)


def test_a_future_completes_with_its_work(group: RoundGroup) -> None:
    group.configure(HashStore(), "round-1/", 0, 1, TIMEOUT)
    total = torch.ones(3)
    future = group.future(dist.all_reduce(total, async_op=True))
    future.wait()
    assert total.tolist() == [1.0, 1.0, 1.0]
    assert group.blocked_for() is None and group.abandoned == 0
    group.abort("late")  # settled futures stay settled
    assert future.value() is not None
    with pytest.raises(HorovodInternalError, match="late"):
        group.future(dist.all_reduce(total, async_op=True)).wait()
    assert group.blocked_for() is None


class Holder:
    def __init__(self, group: RoundGroup) -> None:
        self.released = 0
        group.on_destroy(self.release)

    def release(self) -> None:
        self.released += 1


def test_on_destroy_calls_live_holders_before_each_teardown(group: RoundGroup) -> None:
    holder, dropped = Holder(group), Holder(group)
    del dropped  # held weakly: collectable, then forgotten
    group.destroy()  # nothing formed yet: nothing to release
    assert holder.released == 0
    for round_number in (1, 2):
        group.configure(HashStore(), f"round-{round_number}/", 0, 1, TIMEOUT)
    assert holder.released == 1  # configuring round 2 destroyed round 1
    group.destroy()
    assert holder.released == 2


def test_await_abort_tells_why_once_the_group_is_aborted() -> None:
    group = RoundGroup("gloo", torch.device("cpu"))
    assert group.await_abort(0.01) is None, "healthy: the wait runs out"
    timer = threading.Timer(0.05, group.abort, args=("a member of round 1 failed",))
    timer.start()
    try:
        assert group.await_abort(5.0) == "a member of round 1 failed"
    finally:
        timer.join()


def test_every_group_made_in_a_round_has_the_rounds_timeout(group: RoundGroup) -> None:
    """torch gives a new group 30 minutes, not the default group's timeout: a collective of
    FSDP2 on a device mesh's group would wait that long for a member that vanished."""
    for seconds in (7, 11):  # each round's own
        timeout = datetime.timedelta(seconds=seconds)
        group.configure(HashStore(), f"round-{seconds}/", 0, 1, timeout)
        made = [dist.new_group(), dist.new_group([0], backend="gloo")]
        for made_group in made:
            backend = made_group._get_backend(torch.device("cpu"))
            assert backend.options._timeout == timeout  # type: ignore[attr-defined]
    group.destroy()
