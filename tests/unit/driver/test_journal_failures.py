"""The record tells each failed round once, naming the worker that failed, whichever the
driver sees first: the failed worker's exit or a survivor's rollback."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from elasticjob.driver.job_record import EventKind
from elasticjob.driver.job_state import JobState
from elasticjob.driver.journal import JobJournal

Step = Callable[[JobJournal], None]


def rolled_back(host: str) -> Step:
    return lambda journal: journal.collective_failed(host, 1, 4)


def exited(host: str) -> Step:
    return lambda journal: journal.failed(host, 1, 4)


def round_ended(journal: JobJournal) -> None:
    journal.round_ended(1, 4)


def published(journal: JobJournal) -> None:
    journal.published(2, 2, 0, 2, 0.0)


@pytest.mark.parametrize(
    ("steps", "told"),
    [
        ([exited("b"), round_ended], ["a worker on b failed"]),
        ([rolled_back("a"), exited("b"), round_ended], ["a worker on b failed"]),
        ([rolled_back("a"), rolled_back("c"), exited("b")], ["a worker on b failed"]),
        ([exited("b"), exited("a"), rolled_back("c"), published], ["a worker on b failed"]),
        (
            [rolled_back("a"), rolled_back("c"), round_ended, exited("b"), published],
            ["a collective failed (first reported by a worker on a)"],
        ),
        (
            [rolled_back("a"), published],
            ["a collective failed (first reported by a worker on a)"],
        ),
        ([rolled_back("a")], []),
    ],
)
def test_a_failed_round_is_told_once(steps: list[Step], told: list[str]) -> None:
    journal = JobJournal(lambda: 100.0)
    for step in steps:
        step(journal)
    failures = [e for e in journal.record.events if e.kind is EventKind.FAILURE]
    assert [e.message for e in failures] == told
    assert all(e.round == 1 and e.world_size == 4 for e in failures)


def test_a_failure_of_the_next_round_is_told_again() -> None:
    journal = JobJournal(lambda: 100.0)
    journal.failed("b", 1, 4)
    journal.published(2, 2, 0, 2, 0.0)
    journal.collective_failed("a", 2, 2)
    journal.failed("a", 2, 2)
    failures = [e for e in journal.record.events if e.kind is EventKind.FAILURE]
    assert [(e.round, e.message) for e in failures] == [
        (1, "a worker on b failed"),
        (2, "a worker on a failed"),
    ]


def test_a_fallback_drops_the_world_size_to_zero_until_the_next_round() -> None:
    journal = JobJournal(lambda: 100.0)
    journal.published(1, 4, 4, 0, 0.0)
    journal.failed("a", 1, 4)
    journal.fell_back(1)
    journal.published(2, 2, 2, 0, 0.0)
    assert [s.world_size for s in journal.record.data(JobState(), 1.0).samples] == [4, 0, 2]
