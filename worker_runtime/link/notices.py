"""A background thread that long-polls the job's notices and hands each one to a callback
(:class:`NoticeWatcher`); a script run without a launcher has no notices (:class:`NoNotices`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from elasticjob.backoff import Backoff
from elasticjob.wire.messages import Notice
from elasticjob.worker_runtime.diagnostics.log import get_logger
from elasticjob.worker_runtime.link.rendezvous_client import RendezvousClient, RendezvousClientError

logger = get_logger(__name__)

_POLL_WAIT_S = 20.0
_BACKOFF = Backoff(initial_s=1.0, factor=1.0)
"""The pauses after failed polls: the same each time, as the client has already retried each
poll until its deadline or the service refused it."""


class Notices(Protocol):
    """The job's notices, followed between :meth:`start` and :meth:`stop`."""

    def start(self) -> None:
        """Start following the notices."""

    def stop(self) -> None:
        """Stop following the notices."""


class NoNotices(Notices):
    """A process that no job sends notices to."""

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


class NoticeWatcher(Notices):
    """Delivers every notice of the job, in sequence order, to ``on_notice``.

    The watcher runs on a daemon thread; ``on_notice`` is called on that thread and must be
    quick and thread-safe."""

    def __init__(self, client: RendezvousClient, on_notice: Callable[[Notice], None]) -> None:
        self._client = client
        self._on_notice = on_notice
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="elasticjob-notices", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop polling; the thread exits after its current long-poll returns."""
        self._stop.set()

    def _run(self) -> None:
        after = 0
        pauses = _BACKOFF.delays()
        while not self._stop.is_set():
            try:
                response = self._client.notices(after, _POLL_WAIT_S)
            except RendezvousClientError as exc:
                if self._stop.is_set():
                    return
                logger.warning("notice polling failed: %s; retrying", exc)
                self._stop.wait(next(pauses))
                continue
            for notice in response.notices:
                if notice.seq > after:
                    self._on_notice(notice)
            after = max(after, response.latest_seq)
