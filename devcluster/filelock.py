"""An exclusive ``flock`` on a file that a caller waits for, up to a deadline: the image build
and the image seed take one each, since several checkouts, tests and clusters on a machine
share the cache."""

from __future__ import annotations

import fcntl
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

logger = logging.getLogger(__name__)

POLL_S: Final = 0.5


@contextmanager
def waiting_lock(path: Path, timeout: float, what: str, error: type[Exception]) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (made if missing, with its folder); while another
    process holds it, say once that ``what`` waits and try again until ``timeout``, then raise
    ``error``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as lock:
        deadline = time.monotonic() + timeout
        logged = False
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise error(f"{what}: another process held {path} too long") from None
                if not logged:
                    logger.info("%s: waiting for another process holding %s", what, path)
                    logged = True
                time.sleep(POLL_S)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
