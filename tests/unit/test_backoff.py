"""The backoff policy: its pauses, their jitter, and one operation's pauses up to a deadline."""

from __future__ import annotations

import itertools
import math

import pytest

from elasticjob.backoff import Backoff


def first(backoff: Backoff, count: int, draw: float = 0.0) -> list[float]:
    return list(itertools.islice(backoff.delays(lambda: draw), count))


def test_pauses_grow_by_the_factor_up_to_the_longest() -> None:
    assert first(Backoff(0.2, 2.0, 1.0), 5) == [0.2, 0.4, 0.8, 1.0, 1.0]
    assert first(Backoff(0.05, 1.5, 0.1), 3) == [0.05, pytest.approx(0.075), 0.1]


def test_a_factor_of_one_pauses_the_same_every_time() -> None:
    assert first(Backoff(1.0, 1.0), 3) == [1.0, 1.0, 1.0]


def test_without_a_longest_pause_they_grow_without_end() -> None:
    assert first(Backoff(1.0), 11)[-1] == 1024.0


@pytest.mark.parametrize(("draw", "expected"), [(0.0, [2.0, 4.0]), (0.5, [1.5, 3.0])])
def test_jitter_shortens_each_pause_by_up_to_its_share(draw: float, expected: list[float]) -> None:
    assert first(Backoff(2.0, 2.0, jitter=0.5), 2, draw) == expected


def test_without_jitter_nothing_is_drawn() -> None:
    def draw() -> float:
        raise AssertionError("drawn")

    assert list(itertools.islice(Backoff(1.0).delays(draw), 2)) == [1.0, 2.0]


def test_jitter_draws_anew_for_every_pause() -> None:
    draws = iter([0.0, 0.99, 0.5])
    delays = Backoff(1.0, 1.0, jitter=1.0).delays(lambda: next(draws))
    assert list(itertools.islice(delays, 3)) == [1.0, pytest.approx(0.01), 0.5]


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        pytest.param({"initial_s": -0.1}, "first pause", id="negative-first"),
        pytest.param({"initial_s": math.nan}, "first pause", id="nan-first"),
        pytest.param({"initial_s": 1.0, "factor": 0.5}, "factor", id="shrinking"),
        pytest.param({"initial_s": 1.0, "max_s": 0.5}, "longest pause", id="longest-too-short"),
        pytest.param({"initial_s": 1.0, "jitter": 1.5}, "jitter", id="jitter-over-one"),
        pytest.param({"initial_s": 1.0, "jitter": -0.1}, "jitter", id="negative-jitter"),
    ],
)
def test_a_policy_that_makes_no_sense_is_refused(fields: dict[str, float], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        Backoff(**fields)


def test_an_operations_pauses_end_when_the_next_attempt_would_start_after_the_deadline() -> None:
    now = [100.0]
    pauses = []
    for pause in Backoff(1.0, 2.0).until(107.0, clock=lambda: now[0]):
        pauses.append(pause)
        now[0] += pause
    # 100 + 1 + 2 = 103; a pause of 4 ends at 107, the deadline itself; one of 8 would not
    assert pauses == [1.0, 2.0, 4.0]
    assert now[0] == 107.0


def test_a_deadline_already_passed_leaves_no_pause() -> None:
    assert list(Backoff(0.0).until(5.0, clock=lambda: 5.5)) == []


def test_the_clock_is_read_at_every_pause() -> None:
    now = [0.0]
    retries = Backoff(1.0, 1.0).until(10.0, clock=lambda: now[0])
    assert retries.next_pause() == 1.0
    now[0] = 9.5  # the attempt itself took long
    assert retries.next_pause() is None


def test_a_pause_asked_for_replaces_the_backoffs_and_meets_the_same_deadline() -> None:
    now = [0.0]
    retries = Backoff(1.0, 2.0).until(10.0, clock=lambda: now[0])
    assert retries.next_pause(instead=0.25) == 0.25
    assert retries.next_pause(instead=10.5) is None
    assert retries.next_pause() == 4.0  # the backoff grew under the pauses asked for


def test_the_jitter_reaches_an_operations_pauses() -> None:
    retries = Backoff(2.0, jitter=0.5).until(10.0, clock=lambda: 0.0, random=lambda: 0.5)
    assert next(retries) == 1.5
