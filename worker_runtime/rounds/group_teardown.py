"""Tearing a round's process groups down (``process_group.py`` decides when): a healthy one
the usual way, at once; a broken one detached from ``torch.distributed`` at once and shut down
on a background thread, since its backend may hold an abandoned collective until the group's
timeout, which the next round must not wait for (a peer cut off by the network never resets
its connections). The thread is one that may still be in native code when the process
leaves (``collectives/lingering.py``).
"""

from __future__ import annotations

import threading
import time

import torch.distributed as dist

from elasticjob.worker_runtime.collectives import lingering
from elasticjob.worker_runtime.diagnostics.log import get_logger

logger = get_logger(__name__)


def tear_down_in_background() -> None:
    """Forget every process group now and shut them down on a thread of their own (a broken
    group's end); the usual destroy when this version of torch keeps its groups otherwise."""
    groups = _detach_groups()
    if groups is None:
        destroy_default_group()
        return
    # The thread empties ``groups``: no reference to a group stays on this thread.
    teardown = threading.Thread(
        target=_shut_down, args=(groups,), name="abandoned-group-teardown", daemon=True
    )
    teardown.start()
    lingering.track(teardown)


def destroy_default_group() -> None:
    """Destroy ``torch.distributed``'s groups the usual way (a healthy group's end)."""
    try:
        dist.destroy_process_group()
    except (RuntimeError, ValueError) as exc:  # a broken group may refuse a clean destroy
        logger.debug("destroying the process group: %s", exc)


def _detach_groups() -> list[dist.ProcessGroup] | None:
    """Forget every process group as ``destroy_process_group()`` does, without shutting
    them down; return them (their shutdown is the caller's), or None when this version of
    torch keeps its groups differently (then the caller destroys them the usual way)."""
    c10d = dist.distributed_c10d
    world = getattr(c10d, "_world", None)
    tables = ("pg_map", "pg_names", "pg_group_ranks", "pg_backend_config", "pg_to_tag",
              "tags_to_pg", "pg_coalesce_state")  # fmt: skip
    set_default = getattr(c10d, "_update_default_pg", None)
    unregister = getattr(c10d, "_unregister_all_process_groups", None)
    if world is None or set_default is None or unregister is None:
        return None
    if not all(hasattr(world, t) for t in tables) or getattr(world, "comms", None):
        return None
    groups = list(world.pg_names)
    set_default(None)
    for table in tables:
        getattr(world, table).clear()
    unregister()
    world.group_count = 0
    return groups


def _shut_down(groups: list[dist.ProcessGroup]) -> None:
    """Shut detached groups down and drop them, on a thread of their own: the last reference
    to a group must go here, since its destructor joins the backend's threads, which wait out
    any abandoned collective (the caller keeps only the list, emptied here)."""
    started = time.monotonic()
    while groups:
        group = groups.pop()
        try:
            group.shutdown()
        except (RuntimeError, ValueError) as exc:
            logger.debug("shutting down an abandoned process group: %s", exc)
        del group
    logger.debug("abandoned process groups released in %.1f s", time.monotonic() - started)
