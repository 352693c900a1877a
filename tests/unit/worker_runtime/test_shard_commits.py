"""Which commit a new round of a sharded state resumes from (``choose_commit``), one row per
case: commits confirmed everywhere, a commit confirmed by some members and pending on the
others, a commit nobody confirmed, newcomers, and the job's first round."""

from __future__ import annotations

import pytest

from elasticjob.worker_runtime.elastic.sharded.shard_commits import (
    CommitInfo,
    RankCommits,
    choose_commit,
)


def info(number: int, *held: int, shards: int = 4) -> CommitInfo:
    return CommitInfo(number, shards, held)


NEWCOMER = RankCommits()

ROWS = [
    pytest.param({0: NEWCOMER, 1: NEWCOMER}, None, id="the job's first round: nothing"),
    pytest.param(
        {0: RankCommits(pending=info(1, 0)), 1: RankCommits(pending=info(1, 1))},
        None,
        id="only pending commits: none is known complete",
    ),
    pytest.param(
        {0: RankCommits(info(5, 0, 3)), 1: RankCommits(info(5, 1, 0)), 2: NEWCOMER},
        (5, {0: info(5, 0, 3), 1: info(5, 1, 0)}),
        id="confirmed everywhere, a newcomer holds nothing",
    ),
    pytest.param(
        {
            0: RankCommits(info(5, 0, 3)),
            1: RankCommits(info(4, 1, 0), pending=info(5, 1, 0)),
            2: RankCommits(info(4, 2, 1), pending=info(5, 2, 1)),
        },
        (5, {0: info(5, 0, 3), 1: info(5, 1, 0), 2: info(5, 2, 1)}),
        id="confirmed by one member: the pending ones roll forward to it",
    ),
    pytest.param(
        {
            0: RankCommits(info(4, 0, 3), pending=info(5, 0, 3)),
            1: RankCommits(info(4, 1, 0)),
            2: RankCommits(info(4, 2, 1), pending=info(5, 2, 1)),
        },
        (4, {0: info(4, 0, 3), 1: info(4, 1, 0), 2: info(4, 2, 1)}),
        id="confirmed by nobody: the one before, which everyone holds",
    ),
    pytest.param(
        {0: RankCommits(info(7, 0, 1, shards=2)), 1: RankCommits(info(3, 1, 0, shards=2))},
        (7, {0: info(7, 0, 1, shards=2)}),
        id="a stale member is left out",
    ),
]


@pytest.mark.parametrize(("ranks", "expected"), ROWS)
def test_choose_commit(
    ranks: dict[int, RankCommits], expected: tuple[int, dict[int, CommitInfo]] | None
) -> None:
    assert choose_commit(ranks) == expected
