"""A worker's reports (``worker_runtime.reports``): whether the driver has its result."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from elasticjob.wire.messages import ResultRequest, WorkerState
from elasticjob.worker_runtime.link.rendezvous_client import RendezvousClientError
from elasticjob.worker_runtime.link.reports import DriverReports, NoReports, script_failure


class Client:
    """Takes result reports; refuses them while ``down``."""

    def __init__(self, down: bool) -> None:
        self.down = down
        self.results: list[ResultRequest] = []

    def report_result(self, request: ResultRequest, *, retry_for_s: float | None = None) -> None:
        if self.down:
            raise RendezvousClientError("the rendezvous service cannot be reached")
        self.results.append(request)

    def report_progress(self, request: Any) -> None:
        raise AssertionError("no progress in these tests")


@pytest.mark.parametrize(("down", "delivered"), [(False, True), (True, False)])
def test_the_result_counts_as_delivered_only_once_a_report_arrived(
    down: bool, delivered: bool
) -> None:
    client = Client(down)
    reports = DriverReports(client, "host-a", 1, lambda: (1, 0, 7))  # type: ignore[arg-type]
    assert not reports.end_delivered
    reports.result(WorkerState.FAILURE, script_failure("x" * 5000 + "the error"))
    assert reports.end_delivered is delivered
    if delivered:
        (sent,) = client.results
        assert (sent.hostname, sent.local_rank, sent.state) == ("host-a", 1, WorkerState.FAILURE)
        assert sent.script_exit is not None and sent.script_exit.exit_code == 1
        assert len(sent.script_exit.log_tail) == 4000, "the end of a long message"
        assert sent.script_exit.log_tail.endswith("the error")


def test_a_result_says_how_the_script_failed_with_a_failure_only() -> None:
    """One wire form of a script's failure: a FAILURE carries it, a SUCCESS cannot."""
    failure = script_failure("ValueError: bad batch")
    for state, script_exit in ((WorkerState.FAILURE, None), (WorkerState.SUCCESS, failure)):
        with pytest.raises(ValidationError, match="script_exit comes with a FAILURE result"):
            ResultRequest(hostname="host-a", local_rank=0, state=state, script_exit=script_exit)


def test_a_standalone_process_reports_nothing() -> None:
    reports = NoReports()
    reports.result(WorkerState.FAILURE, script_failure("boom"))
    assert not reports.end_delivered
