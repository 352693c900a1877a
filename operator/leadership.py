"""What an operator replica does when it comes to lead and when it stops: the one owner of
"this replica leads".

- **Lead.** Its rendezvous service serves jobs again (a job not served yet gets 503, retry,
  for the adoption window), the job supervisor starts every job's controller (each adopts its
  recorded round, as after a restart), and the replica routes the workers to itself: it puts
  the leader label on its pod (the rendezvous Service selects it) and takes it off the
  previous holder's pod.
- **Stand down.** Its rendezvous service answers every job 503 (its workers retry and reach
  the leader), the controllers stop and hand their jobs over (nothing ends, no pod is
  touched), and the label comes off its pod.

A replica that starts takes the label off its own pod first: a container restarted in a pod
that led is a standby until it wins the election again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Final

from kubernetes.client.exceptions import ApiException

from elasticjob.operator import pods as podlib
from elasticjob.operator.api import LABEL_OPERATOR_LEADER
from elasticjob.operator.kube import KubeApi
from elasticjob.operator.leader_lease import pod_of
from elasticjob.operator.supervisor import JobSupervisor
from elasticjob.rendezvous.server import RendezvousService

logger = logging.getLogger(__name__)

ADOPTION_WINDOW_S: Final = 60.0
"""After it comes to lead, how long the rendezvous service answers 503 (retry) rather than 403
for jobs that existed before and have not been taken back yet."""
LABEL_TIMEOUT_S: Final = 2.0
"""One try of a label change on an operator pod."""
LABEL_RETRY_S: Final = 0.5
"""The pause before a label change that failed is tried again."""


class OperatorLeadership:
    """Carries out leading and standing down for one replica (see the module docstring)."""

    def __init__(
        self,
        api: Callable[[], KubeApi],
        service: Callable[[], RendezvousService],
        jobs: JobSupervisor,
        own_pod: tuple[str, str] | None,
        *,
        on_change: Callable[[bool], None] = lambda _leading: None,
    ) -> None:
        self._api = api
        self._service = service
        self._jobs = jobs
        self._own_pod = own_pod
        self._on_change = on_change
        self._routing: asyncio.Task[None] | None = None
        self.leading = False

    async def start_standing_by(self) -> None:
        """A standby from the start: no job is served, the label is off its pod."""
        self._service().stand_by()
        if self._own_pod is not None:
            await self._relabel(self._own_pod[1], None)

    async def lead(self, previous: str, expected: Iterable[str] = ()) -> None:
        """It leads: serve, run and route (see the module docstring). The jobs its supervisor
        saw and have not ended, and ``expected`` (job ids), get 503 until they are served."""
        self.leading = True
        jobs = [podlib.job_id(namespace, name) for namespace, name in self._jobs.unended()]
        self._service().lead([*jobs, *expected], ADOPTION_WINDOW_S)
        self._jobs.lead()
        self._on_change(True)
        if self._own_pod is not None:
            self._routing = asyncio.create_task(self._route_here(previous), name="route here")

    async def stand_down(self, *, lost: bool) -> None:
        """It no longer leads: answer 503, hand the jobs over, unroute."""
        self.leading = False
        self._service().stand_by()
        if self._routing is not None:
            self._routing.cancel()
            await asyncio.gather(self._routing, return_exceptions=True)
            self._routing = None
        await self._jobs.stand_down(at_once=lost)
        self._on_change(False)
        if self._own_pod is not None:
            await self._relabel(self._own_pod[1], None)

    async def _route_here(self, previous: str) -> None:
        """Label its own pod, unlabel the previous holder's, each until it is done."""
        assert self._own_pod is not None
        me = self._own_pod[1]
        changes: list[tuple[str, str | None]] = [(me, "true")]
        if previous and pod_of(previous) != me:
            changes.append((pod_of(previous), None))
        await asyncio.gather(*(self._relabel(pod, value, retry=True) for pod, value in changes))
        logger.info("the rendezvous Service routes workers to this operator (pod %s)", me)

    async def _relabel(self, pod: str, value: str | None, *, retry: bool = False) -> None:
        assert self._own_pod is not None
        namespace = self._own_pod[0]
        while True:
            try:
                await self._api().label_pod(
                    namespace, pod, {LABEL_OPERATOR_LEADER: value}, LABEL_TIMEOUT_S
                )
                return
            except (ApiException, OSError) as exc:
                logger.warning(
                    "could not %s the leader label %s pod %s/%s: %s",
                    "put" if value else "take",
                    "on" if value else "off",
                    namespace,
                    pod,
                    exc,
                )
                if not retry:
                    return
            await asyncio.sleep(LABEL_RETRY_S)
