"""Handles of asynchronous collectives: Horovod's ``synchronize(handle)`` and ``poll(handle)``.

An ``*_async`` function issues its collective on the current round's group and returns an
integer handle at once. :func:`synchronize` waits for it through the round's
:class:`~elasticjob.worker_runtime.rounds.process_group.RoundGroup` (so the driver's failure notice
wakes it at once) and returns the operation's output; a handle whose round broke, or was
replaced by a newer round before it was synchronized, raises :class:`HorovodInternalError`.
:func:`poll` never blocks.

Horovod's collectives are matched by name, as in Horovod (``negotiation.py``): ranks may
issue them in different orders, and synchronize them in any order.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from elasticjob.worker_runtime.basics import current
from elasticjob.worker_runtime.collectives.call_descriptions import Call
from elasticjob.worker_runtime.collectives.negotiated_calls import Start
from elasticjob.worker_runtime.collectives.negotiation import Negotiation
from elasticjob.worker_runtime.exceptions import HorovodInternalError


@dataclass
class _Handle:
    round: int
    works: Sequence[Any]
    finish: Callable[[], Any]


_handles: dict[int, _Handle] = {}
_expired: dict[int, int] = {}
"""Handles of earlier rounds never synchronized, by round: their buffers are let go as soon as
a newer round issues a collective, their ``synchronize`` still raises."""
_lock = threading.Lock()
_numbers = itertools.count(1)


def issue(works: Sequence[Any], finish: Callable[[], Any]) -> int:
    """Register collectives just issued on the current round's group (``torch.distributed``
    works) and the function that gives their output once all are done; returns the handle."""
    handle = _Handle(current().round, list(works), finish)
    with _lock:
        for number in [n for n, h in _handles.items() if h.round != handle.round]:
            _expired[number] = _handles.pop(number).round
        number = next(_numbers)
        _handles[number] = handle
    return number


def negotiated(negotiation: Negotiation, name: str | None, call: Call, start: Start) -> int:
    """Submit this rank's ``call`` of the collective ``name`` to ``negotiation`` (the round's,
    or a process set's); ``start`` issues it once every member's call agrees. Returns the
    handle."""
    submitted = negotiation.submit(name, call, start)
    return issue([submitted], submitted.result)


def _stale(issued_in: int) -> str | None:
    """Why a handle issued in round ``issued_in`` can never complete (None if it may)."""
    runtime = current()
    if runtime.round != issued_in:
        return (
            f"the collective was issued in round {issued_in}; the group was re-formed "
            f"since (round {runtime.round})"
        )
    return runtime.group.errored()


def poll(handle: int) -> bool:
    """Whether the asynchronous operation ``handle`` has finished, without blocking. After it
    returns True, :func:`synchronize` does not block (it raises at once if the round broke)."""
    with _lock:
        pending = _handles.get(handle)
        expired = handle in _expired
    if expired:
        return True
    if pending is None:
        raise ValueError(f"unknown handle {handle} (already synchronized?)")
    if _stale(pending.round) is not None:
        return True
    return all(work.is_completed() for work in pending.works)


def synchronize(handle: int) -> Any:
    """Wait for the asynchronous operation ``handle`` and return its output (a tensor, or a
    list or tuple of tensors for grouped operations and ``alltoall`` with splits). Raises
    :class:`HorovodInternalError` when its round broke. An unknown handle (already
    synchronized) gives None, as in Horovod."""
    with _lock:
        pending = _handles.pop(handle, None)
        expired = _expired.pop(handle, None)
    if expired is not None:
        raise HorovodInternalError(str(_stale(expired)))
    if pending is None:
        return None
    reason = _stale(pending.round)
    if reason is not None:
        raise HorovodInternalError(reason)
    group = current().group
    for work in pending.works:
        group.wait(work)
    return pending.finish()
