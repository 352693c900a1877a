"""The commit pipeline of a sharded state: its commits, numbered alike on every member of the
round, the copies of the newest moving beside training, and the end of a round.

A commit is made *pending* at once (``commit``: this rank's snapshot, the other attributes'
state dicts, the step count) and its copies go to the ranks that keep them on a thread of
their own (``shard_copies.CopiesInFlight``); a barrier there confirms it. One commit is in
flight at most: the next one, a durable checkpoint and ``ShardedState.wait_for_commit`` wait
for it first (:meth:`CommitPipeline.wait`). A peer's failure reaches the training thread as a
collective failure only: the copies' thread aborts the round's group, so the next collective
(or wait for the commit) fails, and ``elastic.run`` rolls back (``ShardedState.restore``),
which ends the round here.

A round ends once (:meth:`CommitPipeline.end_round`): at a rollback, or when its group is
destroyed. The commit in flight is settled then, for as long as :func:`settle_deadline` says,
and becomes the last confirmed one or stays pending with the copies that arrived; a new
round resumes from what the members hold (``shard_commits.choose_commit``) and numbers its
commits from it (:meth:`CommitPipeline.resume`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from elasticjob.worker_runtime.elastic.sharded.shard_commits import Commit, RankCommits
from elasticjob.worker_runtime.elastic.sharded.shard_copies import CopiesInFlight, Outcome
from elasticjob.worker_runtime.elastic.sharded.shard_layout import MeshLayout
from elasticjob.worker_runtime.elastic.sharded.shard_plan import copy_holders, extra_copies
from elasticjob.worker_runtime.elastic.sharded.shard_snapshot import ShardSnapshot
from elasticjob.worker_runtime.exceptions import HorovodInternalError

if TYPE_CHECKING:
    from elasticjob.worker_runtime.runtime import Runtime

SETTLE_TIMEOUT_S = 10.0
"""How long a broken round waits for its last commit's copies to finish or fail (a dead
peer's transfers fail at once; a peer cut off by the network would hold them until the
collective timeout)."""


def settle_deadline(broken: bool) -> float | None:
    """How long the end of a round waits for its last commit's copies (None: as long as they
    take). A broken round waits :data:`SETTLE_TIMEOUT_S`; a healthy one (a host update, the
    script's shutdown) waits for them, since every member is settling them too and the next
    round resumes from that commit."""
    return SETTLE_TIMEOUT_S if broken else None


class CommitPipeline:
    """This rank's commits of a sharded state (see the module docstring); ``redundancy``: how
    many other ranks keep a copy of each rank's shards."""

    def __init__(self, redundancy: int) -> None:
        self.redundancy = redundancy
        self.confirmed: Commit | None = None
        """The last confirmed commit."""
        self.pending: Commit | None = None
        """The newest commit, not confirmed (yet) by the round: its copies may be in flight."""
        self.runtime: Runtime | None = None
        """The runtime of the round the pipeline commits in (None: before the first)."""
        self.copy_seconds = 0.0
        """How long the last settled commit's copies and barrier took, beside training."""
        self._number = 0
        """The newest commit's number in this round: the one it resumed from, then each one
        made; the same on every member."""
        self._flight: CopiesInFlight | None = None
        self._host_group: dist.ProcessGroup | None = None
        """The round's Gloo group for host memory, until the round ends."""
        self._holders: dict[int, tuple[int, ...]] = {}
        self._layout: MeshLayout | None = None

    @property
    def layout(self) -> MeshLayout | None:
        """How the round the pipeline commits in is sharded (None: before the first)."""
        return self._layout

    def holdings(self) -> RankCommits:
        """What this rank tells a new round it holds (a commit still in flight is settled
        first, as at a healthy round's end)."""
        if self._flight is not None:
            self.end_round(broken=False)
        return RankCommits(
            self.confirmed.info() if self.confirmed is not None else None,
            self.pending.info() if self.pending is not None else None,
        )

    def held(self, number: int) -> Commit | None:
        """This rank's commit ``number``, confirmed or pending (None: it holds none)."""
        for commit in (self.confirmed, self.pending):
            if commit is not None and commit.number == number:
                return commit
        return None

    def resume(self, number: int, held: Commit | None) -> None:
        """A new round resumes from commit ``number``: ``held``, this rank's, becomes the last
        confirmed commit (rolled forward where it was pending; None: this rank holds none of
        it, a newcomer, or the round loads a durable checkpoint). The pending commit is
        dropped, and later commits count from ``number``."""
        if held is not None:
            self.confirmed = held
        self.pending = None
        self._number = number

    def start_round(
        self,
        runtime: Runtime,
        host_group: dist.ProcessGroup,
        nodes: Sequence[str],
        layout: MeshLayout,
    ) -> None:
        """Commit in the round of ``runtime``, sharded as ``layout`` says, from now on:
        copies (those the replicas do not make) go over ``host_group`` to the ranks on other
        ``nodes`` first."""
        self.runtime, self._host_group, self._layout = runtime, host_group, layout
        self._holders = copy_holders(nodes, extra_copies(self.redundancy, layout.replicas))

    def commit(self, snapshot: ShardSnapshot, extras: dict[str, Any]) -> None:
        """Make the next commit of ``snapshot`` and the other attributes' ``extras`` pending,
        at the runtime's step, and send its copies on a thread of their own (after
        :meth:`wait`: one commit is in flight at most)."""
        assert self._flight is None and self.runtime is not None and self._host_group is not None
        assert self._layout is not None
        self._number += 1
        self.pending = Commit(self._number, snapshot, {}, extras, self.runtime.step)
        self._flight = CopiesInFlight(
            snapshot, self._layout, self._holders, self._host_group, self._copies_failed
        )

    def wait(self) -> Commit | None:
        """Block until the newest commit is confirmed; return the last confirmed commit.
        Raises :class:`HorovodInternalError` when a peer failed meanwhile (no collective: one
        rank may call it alone)."""
        self._settle(None)
        if self.pending is not None:
            raise HorovodInternalError("a commit's copies did not complete: a peer failed")
        return self.confirmed

    def end_round(self, *, broken: bool) -> None:
        """The round ended (``broken``: by a failure): settle the commit in flight, waiting
        :func:`settle_deadline`, and let go of the round's host group."""
        self._settle(settle_deadline(broken))
        self._host_group = None

    def _settle(self, timeout_s: float | None) -> None:
        """Take the outcome of the commit in flight, if any, waiting up to ``timeout_s``
        (None: as long as it takes): confirmed, it becomes the last commit; otherwise it stays
        pending, with the copies that arrived."""
        flight, self._flight = self._flight, None
        if flight is None:
            return
        outcome, copies = flight.settle(timeout_s)
        self.copy_seconds = flight.seconds
        assert self.pending is not None
        pending = dataclasses.replace(self.pending, copies=copies)
        if outcome is Outcome.CONFIRMED:
            self.confirmed, self.pending = pending, None
        else:
            self.pending = pending

    def _copies_failed(self, group: dist.ProcessGroup, reason: str) -> None:
        """A commit's copies failed (on their thread): a peer died. The round's group is
        aborted, unless that round is over (a later round's group is not this failure's)."""
        if group is self._host_group and self.runtime is not None:
            self.runtime.group.abort(reason)
