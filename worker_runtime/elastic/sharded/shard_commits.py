"""A rank's commits of a sharded state, and which commit a new round resumes from.

A commit has two phases. In the first, each rank snapshots its shards and exchanges the copies
(``shard_exchange.exchange_copies``); once its own transfers are done the commit is *pending*
on that rank: complete there, but perhaps not on the others. In the second, the round passes a
barrier, and the commit is *confirmed*: a rank that passed the barrier knows that every member
of the round had finished the first phase. The previous confirmed commit is kept until then.

A failure between the phases leaves ranks with different commits: some confirmed the new one,
some hold it pending, some (those whose transfers broke) only the previous one. A commit that
any member confirmed is complete on every member of its round, so the survivors hold it,
confirmed or pending; a commit nobody confirmed may be incomplete, and the previous one is
complete everywhere. :func:`choose_commit` picks accordingly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from elasticjob.worker_runtime.elastic.sharded.shard_exchange import Shards
from elasticjob.worker_runtime.elastic.sharded.shard_snapshot import ShardSnapshot


@dataclass(frozen=True)
class CommitInfo:
    """What a rank tells a new round about one commit it holds."""

    number: int
    """The commit's number, the same on every member of the round that made it."""
    shards: int
    """How many shards the round that made it split the state into (in each replica)."""
    held: tuple[int, ...]
    """The shards this rank holds of it: its own and its copies."""


@dataclass(frozen=True)
class RankCommits:
    """A rank's commits: the last confirmed one and a pending one (None: none)."""

    confirmed: CommitInfo | None = None
    pending: CommitInfo | None = None


@dataclass(frozen=True)
class Commit:
    """One commit on this rank: its number, this rank's shards (the snapshot), the copies it
    keeps of other shards (by shard), the other attributes' state dicts and the step count."""

    number: int
    snapshot: ShardSnapshot
    copies: dict[int, Shards]
    extras: dict[str, Any]
    step: int

    def info(self) -> CommitInfo:
        held = tuple(sorted({self.snapshot.shard, *self.copies}))
        return CommitInfo(self.number, self.snapshot.shards, held)


def choose_commit(ranks: Mapping[int, RankCommits]) -> tuple[int, dict[int, CommitInfo]] | None:
    """The commit a new round resumes from, given what each of its members holds (by new
    rank), and what each member holding it holds of it: the newest commit any member
    confirmed. None: no member confirmed any commit (newcomers only, or the job's first
    round)."""
    confirmed = [r.confirmed.number for r in ranks.values() if r.confirmed is not None]
    if not confirmed:
        return None
    number = max(confirmed)
    holding = {}
    for rank, commits in ranks.items():
        for info in (commits.confirmed, commits.pending):
            if info is not None and info.number == number:
                holding[rank] = info
    return number, holding
