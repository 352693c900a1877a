"""What a replica does when it comes to lead and when it stands down: its rendezvous service,
its job supervisor and the rendezvous Service's EndpointSlice (on a recording API)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any, cast

from elasticjob.operator.kube import KubeApi
from elasticjob.operator.leadership import OperatorLeadership
from elasticjob.operator.service_route import ServiceRoute, unrouted
from elasticjob.operator.supervisor import JobSupervisor, StopSignal
from elasticjob.rendezvous.server import RendezvousService

DEADLINE_S = 5.0
ROUTE = ServiceRoute("system", "elasticjob-operator", "op-b", "uid-b", "10.0.0.2", 8470)
OTHER = ServiceRoute("system", "elasticjob-operator", "op-c", "uid-c", "10.0.0.3", 8470)
VERSION = "discovery.k8s.io/v1beta1"


class Slice:
    """The rendezvous Service's EndpointSlice as the API server keeps it (None: there is none;
    replaced only at the version read), every write the replica makes, and the jobs a list
    finds."""

    def __init__(self, routed: ServiceRoute | None, jobs: list[dict[str, Any]]) -> None:
        self.stored: dict[str, Any] | None = None
        if routed is not None:
            self.stored = routed.made(VERSION) | {"metadata": {"resourceVersion": "1"}}
            self.stored["metadata"]["name"] = ROUTE.service
        self.jobs = jobs
        self.writes: list[list[str]] = []
        """The pods each write routed to."""
        self.before_write: list[ServiceRoute] = []
        """Routes that someone else writes just before the replica's next writes."""

    def routes(self, route: ServiceRoute | None) -> None:
        """Someone else writes the EndpointSlice: to ``route`` (None: to nobody)."""
        assert self.stored is not None
        self.stored = route.routed(self.stored) if route else unrouted(self.stored)
        self.stored["metadata"]["resourceVersion"] += "1"

    def routed(self) -> set[str]:
        endpoints = self.stored["endpoints"] if self.stored else []
        return {e["targetRef"]["name"] for e in endpoints}

    async def served_version(self, candidates: tuple[str, ...]) -> str | None:
        assert VERSION in candidates
        return VERSION

    async def read_endpoint_slice(
        self, namespace: str, name: str, version: str, timeout_s: float
    ) -> dict[str, Any] | None:
        assert (namespace, name, version) == ("system", ROUTE.service, VERSION)
        return copy.deepcopy(self.stored)

    async def write_endpoint_slice(
        self, namespace: str, endpoint_slice: dict[str, Any], timeout_s: float
    ) -> bool:
        assert namespace == "system" and endpoint_slice["metadata"]["name"] == ROUTE.service
        assert endpoint_slice["addressType"] == "IPv4", "the slice as read, with its endpoints"
        version = endpoint_slice["metadata"].get("resourceVersion")
        if version is None:  # a create
            if self.stored is not None:
                return False
            self.stored = copy.deepcopy(endpoint_slice)
            self.stored["metadata"]["resourceVersion"] = "1"
            self.writes.append(sorted(self.routed()))
            return True
        assert self.stored is not None
        if self.before_write:
            self.routes(self.before_write.pop(0))
        if version != self.stored["metadata"]["resourceVersion"]:
            return False
        self.stored = copy.deepcopy(endpoint_slice)
        self.stored["metadata"]["resourceVersion"] += "1"
        self.writes.append(sorted(self.routed()))
        return True

    async def list_jobs(self, namespaces: tuple[str, ...]) -> list[dict[str, Any]]:
        return self.jobs


async def run_until_stopped(
    namespace: str, name: str, body: Mapping[str, Any], stopped: StopSignal
) -> None:
    await stopped.wait()


def job(uid: str) -> dict[str, Any]:
    return {"metadata": {"uid": uid, "namespace": "ns", "name": uid}, "spec": {}, "status": {}}


async def test_leading_serves_runs_and_routes_here_and_standing_down_undoes_it() -> None:
    unseen = job("unseen")  # listed, though the watch has not shown it yet
    api, service = Slice(ROUTE, [unseen]), RendezvousService()
    jobs = JobSupervisor(run_until_stopped, leading=False)
    told: list[bool] = []
    replica = OperatorLeadership(
        lambda: cast(KubeApi, api), lambda: service, jobs, ROUTE, on_change=told.append
    )
    await replica.start_standing_by()  # its container restarted in a pod that led
    assert service.standing_by and api.routed() == set() and api.writes == [[]]
    api.routes(OTHER)
    await jobs.observe(None, job("train"))
    await replica.lead()
    assert not service.standing_by and jobs.leading and told == [True]
    assert service.adopting(), "the job it saw gets 503 until its controller serves it"
    await asyncio.wait_for(_until(lambda: api.routed() == {"op-b"}), DEADLINE_S)
    assert ROUTE.routed_here(api.stored), "its address and rendezvous port, alone"
    service.add_job("ns.train", "the-key", cast(Any, None))
    assert service.adopting(), "the listed job is expected back too"
    await asyncio.wait_for(replica.stand_down(lost=False), DEADLINE_S)
    assert service.standing_by and not jobs.leading and told == [True, False]
    assert api.routed() == set()
    await jobs.stop_all()


async def _until(check: Any) -> None:
    while not check():
        await asyncio.sleep(0.01)


async def test_the_leader_puts_the_route_right_when_someone_changes_it() -> None:
    """No EndpointSlice yet: the leader makes it. Pointed at another pod by hand: within a
    check, it names the leader's pod again, and it alone; a standby checks nothing."""
    api, service = Slice(None, []), RendezvousService()
    jobs = JobSupervisor(run_until_stopped, leading=False)
    replica = OperatorLeadership(
        lambda: cast(KubeApi, api), lambda: service, jobs, ROUTE, route_check_s=0.01
    )
    await replica.lead()
    await asyncio.wait_for(_until(lambda: api.routed() == {"op-b"}), DEADLINE_S)
    api.routes(OTHER)
    await asyncio.wait_for(_until(lambda: api.routed() == {"op-b"}), DEADLINE_S)
    await asyncio.wait_for(replica.stand_down(lost=False), DEADLINE_S)
    api.routes(OTHER)
    writes = len(api.writes)
    await asyncio.sleep(0.05)  # several checks' worth: none runs once it stood down
    assert len(api.writes) == writes and api.routed() == {"op-c"}
    await jobs.stop_all()


async def test_a_replica_that_stands_down_never_erases_a_new_leaders_route() -> None:
    """The new leader writes between the old one's read and its write: the old one's write
    conflicts, it reads again, finds another pod named and leaves the route as it is."""
    api, service = Slice(ROUTE, []), RendezvousService()
    jobs = JobSupervisor(run_until_stopped, leading=False)
    replica = OperatorLeadership(lambda: cast(KubeApi, api), lambda: service, jobs, ROUTE)
    api.before_write.append(OTHER)
    await asyncio.wait_for(replica.start_standing_by(), DEADLINE_S)
    assert api.routed() == {"op-c"} and api.writes == []
    await jobs.stop_all()


async def test_a_replica_outside_a_pod_routes_nothing() -> None:
    api, service = Slice(OTHER, []), RendezvousService()
    jobs = JobSupervisor(run_until_stopped, leading=False)
    replica = OperatorLeadership(lambda: cast(KubeApi, api), lambda: service, jobs, None)
    await replica.start_standing_by()
    await replica.lead()
    await asyncio.wait_for(replica.stand_down(lost=False), DEADLINE_S)
    assert api.writes == [] and api.routed() == {"op-c"}
    await jobs.stop_all()
