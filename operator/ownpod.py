"""What the operator learns from its own pod: whether its workers can reach it, and whether
it must stop because a successor replaces it.

The operator reads its pod (``POD_NAME`` in ``POD_NAMESPACE``, from the downward API) every
:data:`CHECK_INTERVAL_S`, a GET of one object, the load of a leader-election lease renewal.

- **Reachable.** Workers reach the operator through its Service, which routes to ready pods
  only. When the operator's node stops answering (NotReady: its kubelet is gone, its
  containers may run on), the node controller marks the pod not ready at once: the workers'
  heartbeats stop arriving, and their silence says nothing about them. So while the pod is
  not ready the drivers kill nobody for silence (``driver.liveness.Reachability``).
- **Superseded.** Next the node controller evicts the pod and the Deployment starts a
  successor; no kubelet is there to stop the old process. It would go on writing the jobs'
  status and creating pods beside its successor. So once its pod is marked for deletion (or
  gone) the operator stops as on SIGTERM: the workers' connections to it close, and they
  reach the successor through the Service.

An operator that cannot read its pod (the API server is unreachable) keeps what it last
knew: it cannot change anything in the cluster either.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from kubernetes.client.exceptions import ApiException

logger = logging.getLogger(__name__)

CHECK_INTERVAL_S: Final = 1.0
"""How often the operator reads its own pod."""

ReadPod = Callable[[], Awaitable[Mapping[str, Any] | None]]
"""Reads the operator's own pod (None: the API server has no such pod); raises
:class:`ApiException` or :class:`OSError` when it cannot tell."""


@dataclass(frozen=True)
class OwnPod:
    """What the operator's pod, as the API server has it, means for the operator."""

    ready: bool
    """Its Service routes to it: workers can reach it."""
    stop_reason: str | None
    """Why it must stop (None: its pod stands)."""


def own_pod(pod: Mapping[str, Any] | None) -> OwnPod:
    """What ``pod`` (None: the API server has none) means for the operator in it."""
    if pod is None:
        return OwnPod(ready=False, stop_reason="its pod no longer exists")
    deleted_at = (pod.get("metadata") or {}).get("deletionTimestamp")
    conditions = (pod.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    if deleted_at:
        return OwnPod(ready=ready, stop_reason=f"its pod is being deleted (since {deleted_at})")
    return OwnPod(ready=ready, stop_reason=None)


async def follow_own_pod(
    read_pod: ReadPod,
    on_ready: Callable[[bool], None],
    *,
    interval_s: float = CHECK_INTERVAL_S,
) -> str:
    """Read the operator's pod every ``interval_s``, tell ``on_ready`` whether it is ready
    after every read, until the pod says the operator must stop; return why. Cancel it to
    stop following."""
    while True:
        try:
            seen = own_pod(await read_pod())
        except (ApiException, OSError) as exc:  # cannot tell now: the next read may
            logger.debug("could not read the operator's own pod: %s", exc)
        else:
            on_ready(seen.ready)
            if seen.stop_reason is not None:
                return seen.stop_reason
        await asyncio.sleep(interval_s)
