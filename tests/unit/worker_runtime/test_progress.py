"""Rank 0's progress leaves from a background thread: the training loop never waits for
the rendezvous service, a report that does not arrive is dropped, the newest one wins."""

from __future__ import annotations

import threading
import time

from elasticjob.wire import ProgressRequest
from elasticjob.worker_runtime.progress import ProgressReporter
from elasticjob.worker_runtime.rendezvous_client import RendezvousClientError

DEADLINE = 5.0


def progress(step: int) -> ProgressRequest:
    return ProgressRequest(round=1, epoch=0, step=step)


class Service:
    """A rendezvous service that hangs or refuses on demand, and records what arrives."""

    def __init__(self) -> None:
        self.arrived: list[int] = []
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
            self.changed.notify_all()

    def wait(self, what: str, check: object) -> None:
        with self.changed:
            assert self.changed.wait_for(check, DEADLINE), what  # type: ignore[arg-type]


def test_offering_never_waits_for_a_hanging_service() -> None:
    service = Service()
    service.hanging.set()
    reporter = ProgressReporter(service.send, interval_s=0.0)
    try:
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
    finally:
        reporter.stop()


def test_reports_that_do_not_arrive_are_dropped_and_reporting_goes_on() -> None:
    service = Service()
    service.down = True
    reporter = ProgressReporter(service.send, interval_s=0.0)
    try:
        reporter.offer(progress(1))
        service.wait("an attempt", lambda: service.attempts == 1)
        service.down = False
        reporter.offer(progress(2))
        service.wait("the next report", lambda: service.arrived == [2])
    finally:
        reporter.stop()


def test_reports_leave_at_most_every_interval() -> None:
    service = Service()
    reporter = ProgressReporter(service.send, interval_s=0.3)
    try:
        reporter.offer(progress(0))
        service.wait("the first report", lambda: service.arrived == [0])
        sent_first = time.monotonic()
        reporter.offer(progress(1))
        service.wait("the second report", lambda: service.arrived == [0, 1])
        assert time.monotonic() - sent_first >= 0.3
    finally:
        reporter.stop()
