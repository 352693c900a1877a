"""The worker's place in its current round as the Horovod API reports it, for the test
worker scripts (run by path, so they import it from their own directory)."""

from __future__ import annotations

from typing import Any

import elasticjob.worker_runtime as hvd


def place() -> dict[str, Any]:
    """Round, rank, size, local and cross rank and size, from ``hvd``."""
    return {
        "round": hvd.current_round(),
        "rank": hvd.rank(),
        "size": hvd.size(),
        "local_rank": hvd.local_rank(),
        "local_size": hvd.local_size(),
        "cross_rank": hvd.cross_rank(),
        "cross_size": hvd.cross_size(),
    }
