"""The one classification of the job's notices (``rounds/notice_causes.py``): every kind has a
cause, and the runtime's notice thread hands each notice to the owner its cause names (the
restart agent's use is in ``test_restart_agent.py``)."""

from __future__ import annotations

import pytest

from elasticjob.wire.messages import Notice, NoticeKind
from elasticjob.worker_runtime.rounds.notice_causes import (
    NOTICE_CAUSES,
    NoticeCause,
    classify_notice,
)
from elasticjob.worker_runtime.runtime import _notice_handler


def test_every_kind_of_notice_has_a_cause() -> None:
    assert set(NOTICE_CAUSES) == set(NoticeKind)


@pytest.mark.parametrize(
    ("kind", "cause"),
    [
        pytest.param(NoticeKind.ROUND_FAILED, NoticeCause.FAILURE, id="round-failed"),
        pytest.param(NoticeKind.HOSTS_ADDED, NoticeCause.HOSTS, id="hosts-added"),
        pytest.param(NoticeKind.HOSTS_REMOVED, NoticeCause.HOSTS, id="hosts-removed"),
        pytest.param(NoticeKind.SUSPEND, NoticeCause.SUSPEND, id="suspend"),
    ],
)
def test_classify_notice(kind: NoticeKind, cause: NoticeCause) -> None:
    assert classify_notice(Notice(seq=1, kind=kind, round=2)) is cause


class Owners:
    """What the runtime's notice handler told the rounds and the host-update agreement."""

    def __init__(self) -> None:
        self.told: list[tuple[str, int, bool]] = []

    def round_failed(self, round_number: int) -> None:
        self.told.append(("round_failed", round_number, False))

    def saw_notice(self, seq: int, *, suspend: bool = False) -> None:
        self.told.append(("saw_notice", seq, suspend))


@pytest.mark.parametrize(
    ("kind", "told"),
    [
        pytest.param(NoticeKind.ROUND_FAILED, ("round_failed", 4, False), id="round-failed"),
        pytest.param(NoticeKind.HOSTS_ADDED, ("saw_notice", 7, False), id="hosts-added"),
        pytest.param(NoticeKind.HOSTS_REMOVED, ("saw_notice", 7, False), id="hosts-removed"),
        pytest.param(NoticeKind.SUSPEND, ("saw_notice", 7, True), id="suspend"),
    ],
)
def test_the_runtime_hands_each_notice_to_its_owner(
    kind: NoticeKind, told: tuple[str, int, bool]
) -> None:
    owners = Owners()
    on_notice = _notice_handler(owners, owners)  # type: ignore[arg-type]
    on_notice(Notice(seq=7, kind=kind, round=4))
    assert owners.told == [told]
