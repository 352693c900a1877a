"""``State._host_messages``, the view of pending host updates that Horovod scripts read.

Horovod's ``State`` keeps the host-update notifications its worker received in a queue,
``_host_messages``, which ``check_host_updates()`` drains. The attribute is private, but
scripts written for Horovod use it to wait until a host change has reached the worker (Horovod's
own elastic test script does: ``while state._host_messages.empty(): time.sleep(0.1)``). Here
the notices feed the runtime's host-update agreement instead; this read-only view answers
the same questions from it.
"""

from __future__ import annotations

from elasticjob.worker_runtime.basics import current, is_initialized


class HostMessages:
    """Read-only stand-in for Horovod's queue of host-update notifications."""

    def empty(self) -> bool:
        """True until this worker has seen a hosts-added or hosts-removed notice that the next
        ``check_host_updates()`` (``commit()``) will act on; True again once it has."""
        return not (is_initialized() and current().host_update_pending())

    def qsize(self) -> int:
        """1 while a host update is pending (:meth:`empty` is False), else 0."""
        return 0 if self.empty() else 1
