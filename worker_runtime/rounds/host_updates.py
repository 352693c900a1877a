"""The agreement on host updates: every rank of a round stops for a hosts-added,
hosts-removed or suspend notice at the same step.

Each rank votes with the newest such notice it has seen (or the one its round already
accounts for); the votes are reduced across ranks, so every rank decides from the same value,
never from rank 0's view alone. Once stopped, the ranks agree the same way on whether the job
is being suspended (:meth:`HostUpdateAgreement.suspend_agreed`).
"""

from __future__ import annotations

import math
import threading

import torch
import torch.distributed as dist

from elasticjob.worker_runtime.exceptions import HostsUpdatedInterrupt
from elasticjob.worker_runtime.rounds.process_group import RoundGroup

VOTE_DTYPES = (torch.float32, torch.float64)
"""Dtypes of a gradient buffer that can carry a vote exactly (a notice sequence number)."""


class HostUpdateAgreement:
    """One rank's side of the agreement. Notices arrive on the notice thread; everything else
    runs on the training thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest_seq = 0
        self._handled_seq = 0
        self._settled: float | None = None
        self._suspend_seq = 0

    def saw_notice(self, seq: int, *, suspend: bool = False) -> None:
        """A hosts notice (``suspend``: a suspend notice) with sequence number ``seq``
        arrived. Thread-safe."""
        with self._lock:
            self._latest_seq = max(self._latest_seq, seq)
            if suspend:
                self._suspend_seq = max(self._suspend_seq, seq)

    def joined_round(self, notice_seq: int) -> None:
        """A round that accounts for notices up to ``notice_seq`` was joined."""
        with self._lock:
            self._handled_seq = max(self._handled_seq, notice_seq)
        self._settled = None

    def pending(self) -> bool:
        """Whether this rank has seen a hosts notice that its round does not account for and
        that no check has acted on yet. Thread-safe."""
        with self._lock:
            return self._latest_seq > self._handled_seq

    def vote(self) -> int:
        """This rank's view of host updates: equal on every rank while nothing new happened."""
        with self._lock:
            return max(self._latest_seq, self._handled_seq)

    def settle(self, mean: float) -> None:
        """Record the mean of every rank's :meth:`vote`, reduced along with a collective the
        ranks made anyway; the next :meth:`check` uses it instead of a collective of its own."""
        self._settled = mean

    def check(self, group: RoundGroup, size: int) -> None:
        """Raise :class:`HostsUpdatedInterrupt` once any rank has voted for a newer notice:
        from the settled mean if there is one, else from a max-reduction of the votes over
        the round's ``group`` of ``size`` ranks."""
        settled, self._settled = self._settled, None
        if settled is not None:
            # Votes are whole numbers >= the handled one: any newer vote lifts the mean by at
            # least 1/size, far above the rounding of a float reduction.
            if settled - self._handled_seq > 0.5 / size:
                self._handled_seq = math.ceil(settled)
                raise HostsUpdatedInterrupt(skip_sync=False)
            return
        agreed = torch.tensor([self.vote()], dtype=torch.int64, device=group.device)
        group.wait(dist.all_reduce(agreed, op=dist.ReduceOp.MAX, async_op=True))
        seq = int(agreed.item())
        if seq > self._handled_seq:
            self._handled_seq = seq
            raise HostsUpdatedInterrupt(skip_sync=False)

    def suspend_agreed(self, group: RoundGroup) -> bool:
        """Whether the job is being suspended, agreed by every rank of the round's ``group``
        (a collective: every rank calls it once :meth:`check` raised). The rank whose vote
        stopped the round has seen every notice up to it, so a max-reduction of the suspend
        notices seen tells every rank."""
        with self._lock:
            seen = self._suspend_seq
        agreed = torch.tensor([seen], dtype=torch.int64, device=group.device)
        group.wait(dist.all_reduce(agreed, op=dist.ReduceOp.MAX, async_op=True))
        return int(agreed.item()) > 0
