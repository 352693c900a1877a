"""When a rank has a host update pending: what Horovod's ``state._host_messages`` reports."""

from __future__ import annotations

import pytest

from elasticjob.worker_runtime.elastic.host_messages import HostMessages
from elasticjob.worker_runtime.exceptions import HostsUpdatedInterrupt
from elasticjob.worker_runtime.rounds.host_updates import HostUpdateAgreement


def test_a_notice_is_pending_until_a_check_acts_on_it() -> None:
    agreement = HostUpdateAgreement()
    assert not agreement.pending()
    agreement.saw_notice(3)
    assert agreement.pending()
    agreement.settle(3.0)  # every rank voted 3, reduced with a gradient bucket
    with pytest.raises(HostsUpdatedInterrupt):
        agreement.check(group=None, size=1)  # type: ignore[arg-type]  # settled: no collective
    assert not agreement.pending()


def test_a_notice_the_joined_round_accounts_for_is_not_pending() -> None:
    agreement = HostUpdateAgreement()
    agreement.saw_notice(2)
    agreement.joined_round(notice_seq=2)
    assert not agreement.pending()
    agreement.saw_notice(4)  # a later notice is
    assert agreement.pending()


def test_host_messages_are_empty_without_a_runtime() -> None:
    messages = HostMessages()
    assert messages.empty()
    assert messages.qsize() == 0
