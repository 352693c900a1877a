"""The job's pod map: watch events, create responses and re-lists merged by resourceVersion
(an older copy never overwrites a newer one, a deleted pod never comes back, a re-list catches
up with what the watch missed), and when the controller re-lists."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from elasticjob.operator.podmap import PodChange, PodMap, Resync
from tests.support.clock import FakeClock


def pod(name: str, version: int | str | None, phase: str = "Running", uid: str = "") -> Any:
    metadata: dict[str, Any] = {"name": name, "uid": uid or f"uid-{name}"}
    if version is not None:
        metadata["resourceVersion"] = str(version)
    return {"metadata": metadata, "status": {"phase": phase}}


@dataclass(frozen=True)
class Listed:
    """A re-list: the pods and the list's resourceVersion."""

    pods: tuple[Any, ...]
    version: str | None


Step = tuple[str, Any] | Listed


def run(steps: list[Step]) -> tuple[PodMap, list[PodChange]]:
    pods = PodMap(FakeClock(100.0))
    changes = []
    for step in steps:
        if isinstance(step, Listed):
            changes.append(pods.replace(step.pods, step.version))
        else:
            changes.append(pods.apply(*step))
    return pods, changes


def phases(pods: PodMap) -> dict[str, str]:
    return {name: p["status"]["phase"] for name, p in pods.snapshot().items()}


@pytest.mark.parametrize(
    ("steps", "expected", "removed"),
    [
        ([("ADDED", pod("a", 5, "Pending"))], {"a": "Pending"}, []),
        (
            [("ADDED", pod("a", 5, "Pending")), ("MODIFIED", pod("a", 7))],
            {"a": "Running"},
            [],
        ),
        (  # the create response (Pending) arrives after the watch's Running copy
            [("MODIFIED", pod("a", 7)), ("ADDED", pod("a", 5, "Pending"))],
            {"a": "Running"},
            [],
        ),
        (  # the same version again changes nothing
            [("MODIFIED", pod("a", 7)), ("MODIFIED", pod("a", 7, "Failed"))],
            {"a": "Running"},
            [],
        ),
        (  # versions compare as integers, not as strings
            [("MODIFIED", pod("a", 9, "Pending")), ("MODIFIED", pod("a", 10))],
            {"a": "Running"},
            [],
        ),
        (
            [("ADDED", pod("a", 5)), ("DELETED", pod("a", 8, "Failed"))],
            {},
            ["a"],
        ),
        (  # delete, then a late modify of the same pod: it stays deleted
            [("ADDED", pod("a", 5)), ("DELETED", pod("a", 8)), ("MODIFIED", pod("a", 6))],
            {},
            ["a"],
        ),
        (  # a delete the map never saw the pod of: a late add does not bring it in
            [("DELETED", pod("a", 8)), ("ADDED", pod("a", 5, "Pending"))],
            {},
            [],
        ),
        (  # a late delete of an earlier pod of the same name leaves the new one
            [("ADDED", pod("a", 9, uid="new")), ("DELETED", pod("a", 6, uid="old"))],
            {"a": "Running"},
            [],
        ),
        (  # no integer versions: nothing is known to be newer, the latest copy wins
            [("MODIFIED", pod("a", "x")), ("ADDED", pod("a", "y", "Pending"))],
            {"a": "Pending"},
            [],
        ),
        (  # a re-list adds a pod the watch missed adding, and a newer copy of another
            [
                ("ADDED", pod("a", 5, "Pending")),
                Listed((pod("a", 7), pod("b", 8)), "9"),
            ],
            {"a": "Running", "b": "Running"},
            [],
        ),
        (  # a re-list drops a pod the watch missed deleting
            [("ADDED", pod("a", 5)), ("ADDED", pod("b", 6)), Listed((pod("a", 5),), "9")],
            {"a": "Running"},
            ["b"],
        ),
        (  # ...which a late event then does not bring back
            [
                ("ADDED", pod("b", 6)),
                Listed((), "9"),
                ("MODIFIED", pod("b", 7, "Failed")),
            ],
            {},
            ["b"],
        ),
        (  # a pod newer than the list (created while it was in flight) stays
            [("ADDED", pod("a", 12, "Pending")), Listed((), "9")],
            {"a": "Pending"},
            [],
        ),
        (  # a re-list older than the copy held changes nothing
            [("MODIFIED", pod("a", 12)), Listed((pod("a", 8, "Pending"),), "9")],
            {"a": "Running"},
            [],
        ),
        (  # a list that still has a pod deleted since does not resurrect it
            [("ADDED", pod("a", 5)), ("DELETED", pod("a", 10)), Listed((pod("a", 5),), "9")],
            {},
            ["a"],
        ),
        (  # a list without an integer version drops nothing
            [("ADDED", pod("a", 5)), Listed((), None)],
            {"a": "Running"},
            [],
        ),
    ],
    ids=[
        "add",
        "newer-modify",
        "older-after-newer",
        "same-version",
        "integer-order",
        "delete",
        "delete-then-late-modify",
        "delete-before-add",
        "late-delete-of-earlier-incarnation",
        "opaque-versions",
        "relist-adds-missed",
        "relist-drops-missed-delete",
        "relist-drop-is-final",
        "relist-keeps-newer-than-list",
        "relist-older-than-held",
        "relist-after-delete",
        "relist-without-version",
    ],
)
def test_pod_map_merges(steps: list[Step], expected: dict[str, str], removed: list[str]) -> None:
    pods, changes = run(steps)
    assert phases(pods) == expected
    assert [name for change in changes for name in change.removed] == removed


def test_a_merge_says_whether_it_changed_anything() -> None:
    _, changes = run(
        [
            ("ADDED", pod("a", 5)),
            ("ADDED", pod("a", 5)),
            Listed((pod("a", 5),), "6"),
            Listed((pod("a", 5), pod("b", 6)), "7"),
        ]
    )
    assert [change.changed for change in changes] == [True, False, False, True]


def test_a_snapshot_does_not_follow_later_merges() -> None:
    pods = PodMap(FakeClock(100.0))
    pods.apply("ADDED", pod("a", 5, "Pending"))
    before = pods.snapshot()
    pods.apply("MODIFIED", pod("a", 6))
    pods.apply("ADDED", pod("b", 7))
    assert before["a"]["status"]["phase"] == "Pending" and set(before) == {"a"}


def test_the_gone_set_is_bounded() -> None:
    pods = PodMap(FakeClock(100.0), gone_limit=2)
    for name in ("a", "b", "c"):
        pods.apply("DELETED", pod(name, 5))
    assert not pods.apply("ADDED", pod("c", 4)).changed
    assert not pods.apply("ADDED", pod("b", 4)).changed
    assert pods.apply("ADDED", pod("a", 4)).changed, "the oldest uid is forgotten"


# --- when to re-list -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("now", "listed_at", "changed_at", "waiting", "due"),
    [
        (5.0, 0.0, 0.0, False, False),
        (10.0, 0.0, 9.0, False, True),  # periodic, whatever changed
        (3.0, 0.0, 0.0, True, True),  # waiting, quiet since the last list
        (3.0, 0.0, 1.0, True, False),  # waiting, but a change came 2 s ago
        (4.0, 0.0, 1.0, True, True),
        (4.0, 2.0, 0.0, True, False),  # listed 2 s ago
        (9.9, 0.0, 0.0, False, False),
    ],
)
def test_resync_is_periodic_and_sooner_while_waiting(
    now: float, listed_at: float, changed_at: float, waiting: bool, due: bool
) -> None:
    policy = Resync(interval_s=10.0, quiet_s=3.0)
    assert policy.due(now, listed_at=listed_at, changed_at=changed_at, waiting=waiting) is due


def test_the_map_times_its_resync_by_its_clock() -> None:
    clock = FakeClock(100.0)
    pods = PodMap(clock, Resync(interval_s=10.0, quiet_s=3.0))
    clock.now += 2.0
    pods.apply("ADDED", pod("a", 5, "Pending"))
    clock.now += 2.0
    assert not pods.resync_due(waiting=True), "a change came 2 s ago"
    clock.now += 1.0
    assert pods.resync_due(waiting=True)
    assert not pods.resync_due(waiting=False)
    pods.replace([pod("a", 5, "Pending")], "6")  # unchanged: the quiet period goes on
    assert not pods.resync_due(waiting=True), "just listed"
    clock.now += 10.0
    assert pods.resync_due(waiting=False)
