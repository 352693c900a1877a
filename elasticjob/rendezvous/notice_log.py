"""A job's notices to its workers (hosts added, hosts removed, a round failed): numbered in
order, the newest :data:`MAX_NOTICES` kept, and every long-poll woken when one is posted."""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterable
from typing import Final

from pydantic import ValidationError

from elasticjob.rendezvous.rendezvous_types import RendezvousError
from elasticjob.rendezvous.wakeup import Wakeup
from elasticjob.wire.messages import Notice, NoticeKind

MAX_NOTICES: Final = 1000
"""How many of its most recent notices a job keeps."""


class NoticeLog:
    """The notices of one job."""

    def __init__(self, job: str) -> None:
        self._job = job
        self._notices: collections.deque[Notice] = collections.deque(maxlen=MAX_NOTICES)
        self.latest_seq = 0
        """The sequence number of the newest notice (0: none yet)."""
        self.posted = Wakeup()
        """Fired whenever a notice is posted."""

    def continue_after(self, seq: int) -> None:
        """Number the next notices after ``seq`` (a round adopted after a restart: its
        members have heard of notices up to ``seq``)."""
        self.latest_seq = max(self.latest_seq, seq)

    def post(self, kind: NoticeKind, round_number: int, hosts: Iterable[str]) -> Notice:
        """Append a notice about ``round_number`` and wake every poll; raises
        :class:`RendezvousError` if a host is not a valid host name."""
        try:
            notice = Notice(seq=self.latest_seq + 1, kind=kind, round=round_number, hosts=hosts)
        except ValidationError as exc:
            raise RendezvousError(f"job {self._job}: invalid notice: {exc}") from exc
        self.latest_seq = notice.seq
        self._notices.append(notice)
        self.posted.fire()
        return notice

    def after(self, seq: int) -> tuple[Notice, ...]:
        """The kept notices newer than ``seq``, oldest first: read from the newest end, so a
        poll costs the notices it gets, not the up to :data:`MAX_NOTICES` kept (every notice
        wakes every worker's poll)."""
        newer = itertools.takewhile(lambda notice: notice.seq > seq, reversed(self._notices))
        return tuple(reversed(tuple(newer)))
