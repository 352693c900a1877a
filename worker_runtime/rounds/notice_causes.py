"""What a job's notice means to a worker: the one classification of notices, for every
process that follows them (the worker runtime, ``runtime.py``; the restart mode's agent).

:data:`NOTICE_CAUSES` is the table from a notice's kind to what it asks of a worker in a
round (:class:`NoticeCause`); :func:`classify_notice` reads it, and :func:`concerns_round`
says whether a notice is news to the round a worker is in. Both are pure.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from elasticjob.wire.messages import Notice, NoticeKind


class NoticeCause(enum.Enum):
    """Why a notice stops the training of a round, and so what the worker does."""

    FAILURE = "a member of the round failed"
    """The round's group is broken: the runtime aborts it (and never forms that round), the
    agent stops its script once it had its chance to fail on its own. A restart
    (``TORCHELASTIC_RESTART_COUNT``)."""
    HOSTS = "hosts were added or are leaving"
    """The runtime's ranks stop at the same step (``host_updates.py``) with their live state;
    the agent stops its script at once. No restart, as under torchrun."""
    SUSPEND = "the job is being suspended"
    """As for hosts, and the state is saved (the runtime checkpoints its last commit; the
    agent's script checkpoints on SIGTERM, or resumes from its last checkpoint of its own);
    the next round never comes. No restart."""


NOTICE_CAUSES: Final[Mapping[NoticeKind, NoticeCause]] = MappingProxyType(
    {
        NoticeKind.ROUND_FAILED: NoticeCause.FAILURE,
        NoticeKind.HOSTS_ADDED: NoticeCause.HOSTS,
        NoticeKind.HOSTS_REMOVED: NoticeCause.HOSTS,
        NoticeKind.SUSPEND: NoticeCause.SUSPEND,
    }
)
"""What each kind of notice asks of a worker."""


def classify_notice(notice: Notice) -> NoticeCause:
    """What ``notice`` asks of a worker (see :data:`NOTICE_CAUSES`)."""
    return NOTICE_CAUSES[notice.kind]


def concerns_round(notice: Notice, round_number: int, joined_seq: int) -> bool:
    """Whether ``notice`` is news to a worker in ``round_number``, which was published when
    the job's notices were at ``joined_seq``: a notice posted before is accounted for by the
    round, and a failure of another round is not this one's."""
    if notice.seq <= joined_seq:
        return False
    return classify_notice(notice) is not NoticeCause.FAILURE or notice.round == round_number
