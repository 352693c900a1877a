"""A background thread that long-polls the job's notices and hands each one to a callback."""

from __future__ import annotations

import threading
from collections.abc import Callable

from elasticjob.wire.messages import Notice
from elasticjob.worker_runtime.log import get_logger
from elasticjob.worker_runtime.rendezvous_client import RendezvousClient, RendezvousClientError

logger = get_logger(__name__)

_POLL_WAIT_S = 20.0


class NoticeWatcher:
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
        while not self._stop.is_set():
            try:
                response = self._client.notices(after, _POLL_WAIT_S)
            except RendezvousClientError as exc:
                if self._stop.is_set():
                    return
                logger.warning("notice polling failed: %s; retrying", exc)
                self._stop.wait(1.0)
                continue
            for notice in response.notices:
                if notice.seq > after:
                    self._on_notice(notice)
            after = max(after, response.latest_seq)
