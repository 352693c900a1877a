"""What an operator replica does when it comes to lead and when it stops: the one owner of
"this replica leads".

- **Lead.** Its rendezvous service serves jobs again (a job not served yet gets 503, retry,
  for the adoption window: those its watch saw, and those a list of the jobs finds), the job
  supervisor starts every job's controller (each adopts its recorded round, as after a
  restart), and the replica routes the workers to itself: it writes its pod's address into
  the rendezvous Service's EndpointSlice (``service_route.py``; made if there is none), and
  checks it again every :data:`ROUTE_CHECK_S` while it leads (a route changed by anyone
  else, by hand or by a former leader that missed its stand-down, is put right within that:
  the workers would otherwise reach a standby, or no operator).
- **Stand down.** Its rendezvous service answers every job 503 (its workers retry and reach
  the leader), the controllers stop and hand their jobs over within the stop grace (nothing
  ends, no pod is touched), and it takes its pod out of the EndpointSlice if it still names it.

A replica that starts takes its pod out of the EndpointSlice first: a container restarted in a
pod that led is a standby until it wins the election again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Final

from kubernetes.client.exceptions import ApiException

from elasticjob.operator import pods as podlib
from elasticjob.operator.finished_jobs import ended
from elasticjob.operator.kube import KubeApi
from elasticjob.operator.service_route import SLICE_VERSIONS, ServiceRoute, unrouted
from elasticjob.operator.supervisor import JobSupervisor
from elasticjob.rendezvous.server import RendezvousService

logger = logging.getLogger(__name__)

ADOPTION_WINDOW_S: Final = 60.0
"""After it comes to lead, how long the rendezvous service answers 503 (retry) rather than 403
for jobs that existed before and have not been taken back yet."""
ROUTE_CHECK_S: Final = 5.0
"""How often the leader checks that the rendezvous Service routes the workers to it alone."""
ROUTE_TIMEOUT_S: Final = 2.0
"""One read or write of the Service's EndpointSlice."""
ROUTE_RETRY_S: Final = 0.5
"""The pause before a read or write that failed is tried again."""
UNROUTE_TRIES: Final = 5
"""Tries of taking the replica's pod out of the Service's EndpointSlice when it stops leading."""


class OperatorLeadership:
    """Carries out leading and standing down for one replica (see the module docstring)."""

    def __init__(
        self,
        api: Callable[[], KubeApi],
        service: Callable[[], RendezvousService],
        jobs: JobSupervisor,
        route: ServiceRoute | None,
        *,
        namespaces: tuple[str, ...] = (),
        stop_grace_s: float | None = None,
        on_change: Callable[[bool], None] = lambda _leading: None,
        route_check_s: float = ROUTE_CHECK_S,
    ) -> None:
        self._api = api
        self._service = service
        self._jobs = jobs
        self._route = route
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
        """A standby from the start: no job is served, no worker routed to its pod."""
        self._service().stand_by()
        await self._unroute()

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
        await self._unroute()

    async def _take_over(self) -> None:
        """Expect back the jobs a list finds (the watch may not have shown them all yet), and
        route the workers here, checking the route again every ``route_check_s``."""
        await self._expect_listed_jobs()
        if self._route is None:
            return
        await self._route_here(taking_over=True)
        logger.info(
            "the rendezvous Service routes workers to this operator (pod %s)", self._route.pod
        )
        while True:
            await asyncio.sleep(self._route_check_s)
            await self._route_here(taking_over=False)

    async def _route_here(self, *, taking_over: bool) -> None:
        """The Service's EndpointSlice names this replica's pod, and no other (made if there is
        none); a route found wrong is logged, unless it is taking over (then it does not name
        this pod yet)."""
        route = self._route
        assert route is not None
        api = self._api()
        while True:
            try:
                version = await self._slice_version()
                if version is None:
                    return
                found = await api.read_endpoint_slice(
                    route.namespace, route.service, version, ROUTE_TIMEOUT_S
                )
                if found is None:
                    made = route.made(version)
                    if await api.write_endpoint_slice(route.namespace, made, ROUTE_TIMEOUT_S):
                        return
                    continue  # made by someone else since it was read: read it
                if route.routed_here(found):
                    return
                if not taking_over:
                    logger.warning(
                        "the rendezvous Service routed the workers elsewhere than to this "
                        "operator's pod %s: put back",
                        route.pod,
                    )
                here = route.routed(found)
                if await api.write_endpoint_slice(route.namespace, here, ROUTE_TIMEOUT_S):
                    return
                continue  # written by someone else since it was read: read it again
            except (ApiException, OSError) as exc:
                logger.warning("could not route the workers to this operator: %s", exc)
            await asyncio.sleep(ROUTE_RETRY_S)

    async def _unroute(self) -> None:
        """Empty the Service's EndpointSlice if it still names this replica's pod (at the
        version read: never what a new leader wrote since), trying :data:`UNROUTE_TRIES`
        times."""
        route = self._route
        if route is None:
            return
        api = self._api()
        for _ in range(UNROUTE_TRIES):
            try:
                version = await self._slice_version()
                found = version and await api.read_endpoint_slice(
                    route.namespace, route.service, version, ROUTE_TIMEOUT_S
                )
                if not found or not route.named_here(found):
                    return
                emptied = unrouted(found)
                if await api.write_endpoint_slice(route.namespace, emptied, ROUTE_TIMEOUT_S):
                    return
                continue  # written by someone else since it was read: read it again
            except (ApiException, OSError) as exc:
                logger.warning("could not take this operator out of the workers' route: %s", exc)
            await asyncio.sleep(ROUTE_RETRY_S)

    async def _slice_version(self) -> str | None:
        """The EndpointSlice API version the cluster serves (None, logged: none)."""
        version = await self._api().served_version(SLICE_VERSIONS)
        if version is None:
            logger.error(
                "the API server serves no EndpointSlice API (%s): the workers cannot be routed "
                "to this operator",
                ", ".join(SLICE_VERSIONS),
            )
        return version

    async def _expect_listed_jobs(self) -> None:
        while True:
            try:
                listed = await self._api().list_jobs(self._namespaces)
                break
            except (ApiException, OSError) as exc:
                logger.warning("could not list the jobs to take over: %s", exc)
            await asyncio.sleep(ROUTE_RETRY_S)
        self._service().also_expect(
            podlib.job_id(job["metadata"]["namespace"], job["metadata"]["name"])
            for job in listed
            if not ended(job)
        )
