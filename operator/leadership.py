"""What an operator replica does when it comes to lead and when it stops: the one owner of
"this replica leads".

- **Lead.** Its rendezvous service serves jobs again (a job not served yet gets 503, retry,
  for the adoption window: those its watch saw, and those a list of the jobs finds), the job
  supervisor starts every job's controller (each adopts its recorded round, as after a
  restart), and the replica routes the workers to itself: it puts the leader label on its pod
  (the rendezvous Service selects it) and takes it off every other operator pod that has it,
  and checks both again every :data:`ROUTE_CHECK_S` while it leads (a label taken off or put on
  by anyone else, by hand or by a former leader that missed its stand-down, is put right
  within that: the workers would otherwise reach a standby, or no operator).
- **Stand down.** Its rendezvous service answers every job 503 (its workers retry and reach
  the leader), the controllers stop and hand their jobs over within the stop grace (nothing
  ends, no pod is touched), and the label comes off its pod.

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
from elasticjob.operator.finished_jobs import ended
from elasticjob.operator.kube import KubeApi
from elasticjob.operator.supervisor import JobSupervisor
from elasticjob.rendezvous.server import RendezvousService

logger = logging.getLogger(__name__)

ADOPTION_WINDOW_S: Final = 60.0
"""After it comes to lead, how long the rendezvous service answers 503 (retry) rather than 403
for jobs that existed before and have not been taken back yet."""
ROUTE_CHECK_S: Final = 5.0
"""How often the leader checks that the leader label is on its pod and on no other."""
LABEL_TIMEOUT_S: Final = 2.0
"""One try of a label change on an operator pod."""
LABEL_RETRY_S: Final = 0.5
"""The pause before a label change that failed is tried again."""
UNLABEL_TRIES: Final = 5
"""Tries of taking the label off the replica's own pod (a leader takes it off any other)."""


class OperatorLeadership:
    """Carries out leading and standing down for one replica (see the module docstring)."""

    def __init__(
        self,
        api: Callable[[], KubeApi],
        service: Callable[[], RendezvousService],
        jobs: JobSupervisor,
        own_pod: tuple[str, str] | None,
        *,
        namespaces: tuple[str, ...] = (),
        stop_grace_s: float | None = None,
        on_change: Callable[[bool], None] = lambda _leading: None,
        route_check_s: float = ROUTE_CHECK_S,
    ) -> None:
        self._api = api
        self._service = service
        self._jobs = jobs
        self._own_pod = own_pod
        self._namespaces = namespaces
        self.stop_grace_s = stop_grace_s
        """How long the jobs' controllers get to stop when the replica stands down (None: the
        supervisor's cancellation timeout); with an election, well within the Lease's
        duration, so that no successor acts before they stopped."""
        self._on_change = on_change
        self._route_check_s = route_check_s
        self._routing: asyncio.Task[None] | None = None
        self.leading = False

    async def start_standing_by(self) -> None:
        """A standby from the start: no job is served, the label is off its pod."""
        self._service().stand_by()
        if self._own_pod is not None:
            await self._relabel(self._own_pod[1], None, tries=UNLABEL_TRIES)

    async def lead(self, expected: Iterable[str] = ()) -> None:
        """It leads: serve, run and route (see the module docstring). The jobs its supervisor
        saw and have not ended, and ``expected`` (job ids), get 503 until they are served."""
        self.leading = True
        jobs = [podlib.job_id(namespace, name) for namespace, name in self._jobs.unended()]
        self._service().lead([*jobs, *expected], ADOPTION_WINDOW_S)
        self._jobs.lead()
        self._on_change(True)
        self._routing = asyncio.create_task(self._take_over(), name="take over")

    async def stand_down(self, *, lost: bool) -> None:
        """It no longer leads: answer 503, hand the jobs over, unroute."""
        self.leading = False
        self._service().stand_by()
        if self._routing is not None:
            self._routing.cancel()
            await asyncio.gather(self._routing, return_exceptions=True)
            self._routing = None
        await self._jobs.stand_down(at_once=lost, grace_s=self.stop_grace_s)
        self._on_change(False)
        if self._own_pod is not None:
            await self._relabel(self._own_pod[1], None, tries=UNLABEL_TRIES)

    async def _take_over(self) -> None:
        """Expect back the jobs a list finds (the watch may not have shown them all yet), and
        route the workers here, checking the route again every ``route_check_s``."""
        await self._expect_listed_jobs()
        if self._own_pod is None:
            return
        await self._route_here(taking_over=True)
        logger.info(
            "the rendezvous Service routes workers to this operator (pod %s)", self._own_pod[1]
        )
        while True:
            await asyncio.sleep(self._route_check_s)
            await self._route_here(taking_over=False)

    async def _route_here(self, *, taking_over: bool) -> None:
        """The leader label on its own pod (first) and on no other; a label found wrong is
        logged, unless it is taking over (then it is not on its pod yet)."""
        assert self._own_pod is not None
        namespace, me = self._own_pod
        while True:
            try:
                labelled = await self._api().list_pods(namespace, f"{LABEL_OPERATOR_LEADER}=true")
                break
            except (ApiException, OSError) as exc:
                logger.warning("could not list the operator pods labelled as leader: %s", exc)
            await asyncio.sleep(LABEL_RETRY_S)
        names = {p["metadata"]["name"] for p in labelled.items}
        if me not in names:
            if not taking_over:
                logger.warning("the leader label was off this operator's pod %s: put back", me)
            await self._relabel(me, "true")
        others = sorted(names - {me})
        if others and not taking_over:
            logger.warning("the leader label was on other pods (%s): taken off", ", ".join(others))
        await asyncio.gather(*(self._relabel(pod, None) for pod in others))

    async def _expect_listed_jobs(self) -> None:
        while True:
            try:
                listed = await self._api().list_jobs(self._namespaces)
                break
            except (ApiException, OSError) as exc:
                logger.warning("could not list the jobs to take over: %s", exc)
            await asyncio.sleep(LABEL_RETRY_S)
        self._service().also_expect(
            podlib.job_id(job["metadata"]["namespace"], job["metadata"]["name"])
            for job in listed
            if not ended(job)
        )

    async def _relabel(self, pod: str, value: str | None, *, tries: int | None = None) -> None:
        """Put the leader label on ``pod`` (``value`` "true") or take it off (None), trying
        until it is done, or ``tries`` times."""
        assert self._own_pod is not None
        namespace = self._own_pod[0]
        tried = 0
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
            tried += 1
            if tries is not None and tried >= tries:
                return
            await asyncio.sleep(LABEL_RETRY_S)
