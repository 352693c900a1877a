"""The job's pod ledger: the one failure transition (what follows each cause is the driver's
decision: tests/unit/driver/test_worker_exits.py), and the pods as the controller sees them
once it acted on them."""

from __future__ import annotations

from typing import Any

from elasticjob.driver.worker_exits import ExitCause
from elasticjob.operator.pod_ledger import PodLedger, killed_reason
from elasticjob.operator.pods import PodState
from tests.support.clock import FakeClock


def pod(name: str, phase: str = "Running", node: str | None = "n1", version: int = 1) -> Any:
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": str(version)},
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase, "containerStatuses": []},
    }


def ledger(*pods: Any) -> PodLedger:
    made = PodLedger(FakeClock(100.0))
    for each in pods:
        made.merge_event("ADDED", each)
    return made


def test_a_pod_fails_once_with_its_node_and_a_later_report_is_no_news() -> None:
    pods = ledger(pod("a"))
    failure = pods.fail("a", ExitCause.KILLED, killed_reason("it sent no heartbeat"), 1)
    assert failure is not None
    assert (failure.name, failure.node, failure.exit_code) == ("a", "n1", 1)
    assert pods.fail("a", ExitCause.EXITED, "worker exited with 1", 1) is None
    assert pods.reported("a")


def test_a_killed_pod_is_seen_failed_while_its_object_still_runs() -> None:
    pods = ledger(pod("hung"), pod("fine"))
    pods.fail("hung", ExitCause.KILLED, killed_reason("its peers could not reach it"), 1)
    views = pods.views()
    assert (views["hung"].state, views["hung"].reason) == (
        PodState.FAILED,
        "a worker process was killed: its peers could not reach it",
    )
    assert views["fine"].state is PodState.RUNNING


def test_a_pod_that_ended_before_it_was_killed_stays_succeeded() -> None:
    pods = ledger(pod("hung", phase="Succeeded"))
    assert pods.succeed("hung")
    assert pods.fail("hung", ExitCause.KILLED, killed_reason("no heartbeat"), 1) is None
    assert pods.views()["hung"].state is PodState.SUCCEEDED
    assert not pods.succeed("hung"), "reported once"


def test_a_pod_deleted_by_someone_else_vanishes_and_one_the_controller_deleted_does_not() -> None:
    pods = ledger(pod("a"), pod("b"))
    assert pods.mark_deleted("b") and not pods.mark_deleted("b")
    _, vanished = pods.merge_event("DELETED", pod("a", version=2))
    assert [(f.name, f.cause, f.exit_code) for f in vanished] == [("a", ExitCause.VANISHED, 137)]
    _, vanished = pods.merge_event("DELETED", pod("b", version=2))
    assert vanished == []


def test_a_relist_without_a_pod_reports_it_vanished() -> None:
    pods = ledger(pod("a"), pod("b"))
    change, vanished = pods.merge_list([pod("a")], "5")
    assert change.removed == ("b",)
    assert [f.name for f in vanished] == ["b"]


def test_deletions_are_taken_once_and_a_deleted_pod_is_not_queued_again() -> None:
    pods = ledger(pod("a"), pod("b"))
    pods.delete_soon("a", grace_s=0)
    pods.delete_soon("b", grace_s=None)
    assert pods.take_deletions() == [("a", 0), ("b", None)]
    assert pods.take_deletions() == []
    pods.mark_deleted("a")
    pods.delete_soon("a", grace_s=0)
    assert pods.take_deletions() == []


def test_draining_pods_are_kept_with_when_they_were_chosen_until_forgotten() -> None:
    pods = ledger(pod("a"))
    pods.drain("a", 7.0)
    assert pods.draining == {"a": 7.0}
    pods.forget("a")
    pods.forget("gone")
    assert pods.draining == {}


def test_members_of_an_adopted_round_that_are_gone_fail_as_vanished() -> None:
    pods = ledger(pod("a"))
    gone = pods.adopted_round_gone(["a", "b"])
    assert [(f.name, f.cause, f.reason) for f in gone] == [
        ("b", ExitCause.VANISHED, "the pod disappeared while the operator was away")
    ]
    assert pods.node_of("a") == "n1" and pods.node_of("b") is None


def test_a_member_seen_gone_before_the_driver_started_is_still_told_to_it() -> None:
    pods = ledger(pod("a"), pod("b"))
    _, vanished = pods.merge_event("DELETED", pod("b", version=2))
    assert [f.name for f in vanished] == ["b"], "told to nobody: no driver yet"
    assert [f.name for f in pods.adopted_round_gone(["a", "b"])] == ["b"]
