"""Rank 0's progress leaves from a background thread: the training loop never waits for
the rendezvous service, a report that does not arrive is dropped, the newest one wins (keeping
the commit durations and the resumed mark of those it replaced), an urgent one leaves at once."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from elasticjob.wire.messages import CheckpointReport, ProgressRequest
from elasticjob.wire.protocol import MAX_REPORTED_CHECKPOINTS, MAX_REPORTED_COMMITS
from elasticjob.worker_runtime.link.progress import ProgressReporter
from elasticjob.worker_runtime.link.rendezvous_client import RendezvousClientError

DEADLINE = 5.0


def progress(step: int) -> ProgressRequest:
    return ProgressRequest(round=1, epoch=0, step=step)


class Service:
    """A rendezvous service that hangs or refuses on demand, and records what arrives."""

    def __init__(self) -> None:
        self.arrived: list[int] = []
        self.requests: list[ProgressRequest] = []
        self.arrived_at: list[float] = []
        self.attempts = 0
        self.hanging = threading.Event()
        self.release = threading.Event()
        self.down = False
        self.changed = threading.Condition()

    def send(self, request: ProgressRequest) -> None:
        with self.changed:
            self.attempts += 1
            self.changed.notify_all()
        if self.hanging.is_set():
            assert self.release.wait(DEADLINE), "never released"
        if self.down:
            raise RendezvousClientError("rendezvous service unreachable")
        with self.changed:
            self.arrived.append(request.step)
            self.requests.append(request)
            self.arrived_at.append(time.monotonic())
            self.changed.notify_all()

    def wait(self, what: str, check: object) -> None:
        with self.changed:
            assert self.changed.wait_for(check, DEADLINE), what  # type: ignore[arg-type]


@contextlib.contextmanager
def reporting(service: Service, interval_s: float) -> Iterator[ProgressReporter]:
    """A reporter sending to ``service``, stopped at the end of the block."""
    reporter = ProgressReporter(service.send, interval_s=interval_s)
    try:
        yield reporter
    finally:
        reporter.stop()


def test_offering_never_waits_for_a_hanging_service() -> None:
    service = Service()
    service.hanging.set()
    with reporting(service, interval_s=0.0) as reporter:
        reporter.offer(progress(0))
        service.wait("the first report sent", lambda: service.attempts == 1)
        started = time.monotonic()
        for step in range(1, 100):
            reporter.offer(progress(step))
        assert time.monotonic() - started < 1.0, "offer waited for the service"
        service.hanging.clear()
        service.release.set()
        service.wait("the newest report", lambda: service.arrived[-1:] == [99])
        assert service.arrived == [0, 99], "the reports in between were replaced"


def test_reports_that_do_not_arrive_are_dropped_and_reporting_goes_on() -> None:
    service = Service()
    service.down = True
    with reporting(service, interval_s=0.0) as reporter:
        reporter.offer(progress(1))
        service.wait("an attempt", lambda: service.attempts == 1)
        service.down = False
        reporter.offer(progress(2))
        service.wait("the next report", lambda: service.arrived == [2])


def test_reports_leave_at_most_every_interval() -> None:
    service = Service()
    with reporting(service, interval_s=0.3) as reporter:
        reporter.offer(progress(0))
        service.wait("the first report", lambda: service.arrived == [0])
        reporter.offer(progress(1))
        service.wait("the second report", lambda: service.arrived == [0, 1])
        assert service.arrived_at[1] - service.arrived_at[0] >= 0.3


def test_an_urgent_report_does_not_wait_for_the_interval() -> None:
    service = Service()
    with reporting(service, interval_s=60.0) as reporter:
        reporter.offer(progress(0))
        service.wait("the first report", lambda: service.arrived == [0])
        reporter.offer(progress(1))
        reporter.offer(ProgressRequest(round=2, epoch=0, step=1, resumed=True), urgent=True)
        service.wait("the urgent report", lambda: service.arrived == [0, 1])
        assert service.requests[-1].resumed and service.requests[-1].round == 2


def sent_while_the_service_hung(offers: list[ProgressRequest]) -> ProgressRequest:
    """The report that leaves once a service that hung on the first report answers again,
    ``offers`` having been handed over meanwhile."""
    service = Service()
    service.hanging.set()
    with reporting(service, interval_s=0.0) as reporter:
        reporter.offer(progress(0))
        service.wait("the first report sent", lambda: service.attempts == 1)
        for request in offers:
            reporter.offer(request)
        service.hanging.clear()
        service.release.set()
        service.wait("the newest report", lambda: service.arrived[-1:] == [offers[-1].step])
        return service.requests[-1]


def test_a_replaced_report_keeps_its_commit_durations_and_resumed_mark() -> None:
    newest = sent_while_the_service_hung(
        [ProgressRequest(round=1, epoch=0, step=1, resumed=True)]
        + [
            ProgressRequest(round=1, epoch=0, step=step, commit_seconds=(0.5,))
            for step in range(2, 100)
        ]
    )
    assert newest.resumed
    assert newest.commit_seconds == (0.5,) * MAX_REPORTED_COMMITS, "the newest ones are kept"


def test_a_resumed_mark_of_an_older_round_is_not_carried_into_a_newer_one() -> None:
    newest = sent_while_the_service_hung(
        [
            ProgressRequest(round=1, epoch=0, step=1, resumed=True),
            ProgressRequest(round=2, epoch=0, step=2),
        ]
    )
    assert not newest.resumed


def checkpoint(step: int) -> CheckpointReport:
    return CheckpointReport(name=f"ckpt-{step}", epoch=0, step=step, seconds=0.1, size_bytes=8)


def test_a_replaced_report_keeps_its_checkpoints_and_the_one_loaded() -> None:
    loaded = checkpoint(0)
    newest = sent_while_the_service_hung(
        [ProgressRequest(round=1, epoch=0, step=0, resumed=True, restored_from=loaded)]
        + [
            ProgressRequest(round=1, epoch=0, step=step, checkpoints=(checkpoint(step),))
            for step in range(1, 40)
        ]
    )
    assert newest.restored_from == loaded
    assert [c.step for c in newest.checkpoints] == list(range(40 - MAX_REPORTED_CHECKPOINTS, 40))


def test_the_checkpoint_loaded_in_an_older_round_is_not_carried_into_a_newer_one() -> None:
    newest = sent_while_the_service_hung(
        [
            ProgressRequest(round=1, epoch=0, step=1, resumed=True, restored_from=checkpoint(1)),
            ProgressRequest(round=2, epoch=0, step=2),
        ]
    )
    assert newest.restored_from is None


def test_a_replaced_report_keeps_the_newest_committed_step() -> None:
    """The script's own progress report (no committed step) replacing a commit's keeps the
    commit's step count: the driver counts a fallback's lost steps from it."""
    newest = sent_while_the_service_hung(
        [
            ProgressRequest(round=1, epoch=0, step=1, committed_step=7),
            ProgressRequest(round=1, epoch=0, step=2, committed_step=8),
            ProgressRequest(round=1, epoch=0, step=3),
        ]
    )
    assert newest.committed_step == 8


def test_a_flush_sends_what_waits_for_the_interval_and_returns_once_it_arrived() -> None:
    service = Service()
    with reporting(service, interval_s=60.0) as reporter:
        assert reporter.flush(DEADLINE), "nothing offered: nothing to wait for"
        reporter.offer(progress(0))
        service.wait("the first report", lambda: service.arrived == [0])
        reporter.offer(progress(1))  # would wait a minute for the interval
        assert reporter.flush(DEADLINE)
        assert service.arrived == [0, 1]


def test_a_flush_gives_up_at_its_timeout_when_the_service_hangs() -> None:
    service = Service()
    service.hanging.set()
    with reporting(service, interval_s=0.0) as reporter:
        reporter.offer(progress(0))
        assert not reporter.flush(0.2)
        service.release.set()
