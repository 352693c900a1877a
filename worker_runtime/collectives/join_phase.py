"""Horovod's ``join`` in the collective negotiation (``negotiation.py``).

Horovod's ``join`` (:meth:`Negotiation.join`): a rank out of data joins, and until every rank
has joined it takes part in the others' allreduces with zeros (their averages still divide by
the whole set's size, as Horovod's do); another kind of collective fails on the ranks that
called it (Horovod's "not supported with Join"). A join is an entry of the same sequence as
the verdicts, so every rank sees the joins and the collectives in one order: a collective is
complete once every rank that has not joined called it, whichever of the count and the join
arrives last (a rank that finds it due claims it on the store: one verdict only); the last
rank to join ends the join phase everywhere, and is what ``join`` returns.

:class:`JoinPhase` is what one rank knows of the phase (under its negotiation's lock);
:func:`serve` issues a joined rank's zeros.
"""

from __future__ import annotations

import functools
from collections.abc import Collection

import torch
import torch.distributed as dist

from elasticjob.worker_runtime.collectives.call_descriptions import Call
from elasticjob.worker_runtime.collectives.negotiated_calls import SERVERS, JoinWork, hold
from elasticjob.worker_runtime.diagnostics.log import get_logger

logger = get_logger(__name__)


class JoinPhase:
    """The current join phase of a round of ``size`` ranks as one rank sees it: who has
    joined (in the sequence's order), the collectives it claimed, its own join."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.joined: set[int] = set()
        self.claims: list[str] = []
        """The keys this rank claimed a collective with in the phase (removed when it ends:
        no rank can find one due then)."""
        self.work: JoinWork | None = None
        """This rank's join, until the phase ends."""

    def refuse_calls(self) -> None:
        """Raise if this rank has joined: it calls no collective of its own until the end."""
        if self.work is not None:
            raise RuntimeError(
                "this rank has joined: it takes part in the other ranks' collectives until "
                "every rank has joined, and calls none of its own"
            )

    def begin(self, outstanding: Collection[str]) -> JoinWork:
        """This rank joins (``outstanding``: its collectives still in progress, refused)."""
        if outstanding:
            raise RuntimeError(
                f"join with collectives of this rank still in progress "
                f"({', '.join(sorted(outstanding))}): wait for them first"
            )
        if self.work is not None:
            raise RuntimeError("this rank has joined already")
        self.work = JoinWork()
        return self.work

    def saw(self, rank: int) -> tuple[frozenset[int], list[str]]:
        """``rank`` joined: the ranks joined so far, and the claims to remove. When it is the
        last, the phase ends: this rank's join completes, returning ``rank``."""
        self.joined.add(rank)
        joined = frozenset(self.joined)
        if len(joined) < self.size:
            return joined, []
        work, claims = self.work, self.claims
        self.joined, self.claims, self.work = set(), [], None
        if work is not None:
            work.last = rank
            work.future.set_result(None)
        return joined, claims

    def fail(self, exc: Exception) -> None:
        """This rank's join could not be published: it fails."""
        if self.work is not None and not self.work.future.done():
            self.work.future.set_exception(exc)


def serve(key: str, call: Call, group: dist.ProcessGroup, device: torch.device | None) -> None:
    """Take part, as a joined rank, in the collective ``key`` the others agreed on (``call``
    is one of theirs): zeros of its dtypes and shapes, reduced as they reduce theirs."""
    try:
        works, finish = SERVERS[call.kind](call, group, device)
    except (RuntimeError, dist.DistError) as exc:  # the round is ending: the others fail too
        logger.debug("a joined rank's part of %s: %s", key, exc)
        return
    done = torch.futures.collect_all([work.get_future() for work in works])
    done.add_done_callback(functools.partial(hold, (works, finish)))
