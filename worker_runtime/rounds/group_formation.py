"""Forming a round's group without waiting out the collective timeout for a member that
cannot come.

``init_process_group`` blocks in the store until every rank has arrived or the timeout (the
collective timeout, a minute by default) has passed, and nothing can interrupt it: when a
member of the round cannot reach the round's store (it is cut off from its peers, or has
died), the driver fails the round within seconds, but the others would wait out the timeout.
So before forming the group, every member connects to the round's store and waits until all
members have arrived there, in short slices, checking between slices whether the round has
failed: then it gives up at once (:class:`HorovodInternalError`) and waits for the next round.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Final

import torch.distributed as dist
from torch.distributed import Store, TCPStore

from elasticjob.worker_runtime.exceptions import HorovodInternalError

SLICE_S: Final = 0.25
"""How long one connect attempt or one wait for the other members lasts: the longest a
member keeps waiting after its round failed."""

_ARRIVED: Final = "elasticjob/arrived"
_ALL_ARRIVED: Final = "elasticjob/all-arrived"


def connect_store(
    address: str, port: int, timeout: datetime.timedelta, failed: Callable[[], bool]
) -> Store:
    """A client of the round's store, connected within ``timeout``; raises
    :class:`HorovodInternalError` once ``failed()`` (the round failed) or at the timeout."""
    deadline = time.monotonic() + timeout.total_seconds()
    while True:
        attempt = datetime.timedelta(seconds=max(min(SLICE_S, deadline - time.monotonic()), 0.01))
        try:
            store = TCPStore(
                address, port, is_master=False, wait_for_workers=False, timeout=attempt
            )
        except (RuntimeError, dist.DistError) as exc:
            if failed():
                raise HorovodInternalError("the round failed before it formed") from exc
            if time.monotonic() >= deadline:
                raise HorovodInternalError(f"cannot reach the round's store: {exc}") from exc
            continue
        store.set_timeout(timeout)
        return store


def await_members(
    store: Store, prefix: str, size: int, timeout: datetime.timedelta, failed: Callable[[], bool]
) -> None:
    """Count this member in on the round's store (keys under ``prefix``) and wait until all
    ``size`` have; raises :class:`HorovodInternalError` once ``failed()`` or at the timeout."""
    deadline = time.monotonic() + timeout.total_seconds()
    try:
        if store.add(prefix + _ARRIVED, 1) == size:
            store.set(prefix + _ALL_ARRIVED, "1")
    except (RuntimeError, dist.DistError) as exc:
        raise HorovodInternalError(f"the round's store failed: {exc}") from exc
    while True:
        try:
            store.wait([prefix + _ALL_ARRIVED], datetime.timedelta(seconds=SLICE_S))
            return
        except (RuntimeError, dist.DistError) as exc:
            if failed():
                raise HorovodInternalError("the round failed before it formed") from exc
            if time.monotonic() >= deadline:
                raise HorovodInternalError(
                    f"not every member of the round reached its store within "
                    f"{timeout.total_seconds():.0f} s"
                ) from exc
