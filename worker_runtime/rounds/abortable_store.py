"""The round's store as its process groups see it: every wait on it gives up as soon as the
round fails.

Forming a process group waits in the store until each member has published its address, and
torch cannot interrupt that wait: when a member dies while the others form a group of the
round (a ``DeviceMesh`` dimension's group in a sharded state's sync), the others would wait
out the collective timeout although the driver failed the round within a second. Every group
of a round is formed on the store given to ``init_process_group`` (a group's keys are under a
prefix of it), so a store whose waits poll the round's state ends all of them at once: the
forming fails with :class:`torch.distributed.DistStoreError`, the round's group is known to be
broken, and the worker rolls back. (Gloo only: NCCL's own threads use the store too, and an
abort of its communicators unblocks its waits.)

Waits poll the wrapped store (``check``) at a growing interval rather than block in slices:
a store's wait that times out makes torch log a warning, for every slice.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Any, cast

import torch.distributed as dist
from torch.distributed import Store

POLL_S = (0.001, 0.05)
"""The first and the longest interval between two looks at the keys waited for: a key that
is there already costs one look, and a failed round is noticed within the longest."""


class AbortableStore(Store):
    """``inner``, whose waits raise :class:`torch.distributed.DistStoreError` once
    ``failed()`` (the round failed) or at their timeout (the wrapped store's own by default).

    Its owner keeps it alive as long as the groups formed on it: torch holds only its native
    part, and a call from there to a collected Python object fails ("Not implemented")."""

    def __init__(self, inner: Store, failed: Callable[[], bool]) -> None:
        super().__init__()
        self._inner = inner
        # torch's stubs lack a store's timeout and clone: reached through an untyped name.
        self._untyped: Any = cast(Any, inner)
        self._failed = failed
        self._clones: list[AbortableStore] = []
        super().set_timeout(self._untyped.timeout)

    def set(self, key: str, value: str) -> None:
        self._inner.set(key, value)

    def get(self, key: str) -> bytes:
        self.wait([key])
        return self._inner.get(key)

    def add(self, key: str, value: int) -> int:
        return self._inner.add(key, value)

    def compare_set(self, key: str, expected_value: str, desired_value: str) -> bytes:
        return self._inner.compare_set(key, expected_value, desired_value)

    def delete_key(self, key: str) -> bool:
        return self._inner.delete_key(key)

    def num_keys(self) -> int:
        return self._inner.num_keys()

    def check(self, keys: list[str]) -> bool:
        return self._inner.check(keys)

    def clone(self) -> AbortableStore:
        """Another client of the same store, with the same end. Kept alive here: torch holds
        only its native part, whose calls need this Python object."""
        clone = AbortableStore(self._untyped.clone(), self._failed)
        self._clones.append(clone)
        return clone

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        super().set_timeout(timeout)
        self._inner.set_timeout(timeout)

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        """Return once every key in ``keys`` is set; raise once the round failed, or at
        ``timeout`` (None: the store's)."""
        limit: datetime.timedelta = self._untyped.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit.total_seconds()
        interval, longest = POLL_S
        while not self._inner.check(keys):
            if self._failed():
                raise dist.DistStoreError(f"the round failed while waiting for {keys}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise dist.DistStoreError(
                    f"timed out after {limit.total_seconds():.0f} s waiting for {keys}"
                )
            time.sleep(min(interval, left))
            interval = min(interval * 2, longest)
