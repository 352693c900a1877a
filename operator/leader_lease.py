"""The leader election's executor: reads the Lease every retry period, asks
:func:`~elasticjob.operator.leader_election.decide` and carries the move out (writes by
``resourceVersion``: of two replicas that write the same version, one gets a conflict and
stays a standby), and tells the operator (:class:`Leadership`) when it comes to lead and when
it stops.

A replica's identity is its pod's name and a random suffix: a container restarted in the same
pod is a new candidate, not the holder it was (:func:`pod_of` reads the pod back)."""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kubernetes.client.exceptions import ApiException

from elasticjob.event_waits import wait_event
from elasticjob.operator.kube import KubeApi
from elasticjob.operator.leader_election import (
    Candidate,
    ElectionSettings,
    Move,
    SeenLease,
    decide,
)

logger = logging.getLogger(__name__)

MIN_CALL_S = 0.1
"""The shortest time an election call is given (a leader near its renew deadline)."""


class Leadership(Protocol):
    """What the operator does when it comes to lead and when it stops."""

    async def lead(self) -> None:
        """It leads from now on."""

    async def stand_down(self, *, lost: bool) -> None:
        """It no longer leads; returns once it stopped acting (``lost``: at once, another may
        act already)."""


@dataclass(frozen=True)
class LeaseRef:
    namespace: str
    name: str


def new_identity(pod: str) -> str:
    """A candidate's identity: its pod's name and a random suffix (pod names have no ``_``)."""
    return f"{pod}_{uuid.uuid4().hex[:8]}"


def pod_of(identity: str) -> str:
    """The pod of a candidate's identity (:func:`new_identity`)."""
    return identity.rsplit("_", 1)[0]


def _micro_time(at: datetime.datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Runs one replica's side of the election (see the module docstring)."""

    def __init__(
        self,
        api: KubeApi,
        lease: LeaseRef,
        identity: str,
        settings: ElectionSettings,
        leadership: Leadership,
        eligible: Callable[[], bool],
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
    ) -> None:
        self._api = api
        self._lease = lease
        self.identity = identity
        self._settings = settings
        self._leadership = leadership
        self._eligible = eligible
        self._clock = clock
        self._wall_clock = wall_clock
        self._leading = False
        self._renewed_at: float | None = None
        self._seen_version: str | None = None
        self._observed_at = 0.0
        self._poke = asyncio.Event()
        self._announcing: set[asyncio.Task[None]] = set()
        self._closing = False

    @property
    def leading(self) -> bool:
        """Whether this replica leads."""
        return self._leading

    def poke(self) -> None:
        """Decide again now (whether it may lead changed)."""
        self._poke.set()

    async def run(self) -> None:
        """Take part in the election until cancelled."""
        logger.info(
            "leader election: %s is a candidate for Lease %s/%s",
            self.identity,
            self._lease.namespace,
            self._lease.name,
        )
        while not self._closing:
            try:
                await self.step()
            except Exception:  # the election goes on: the renew deadline still applies
                logger.exception("leader election: a step failed")
            if self._closing:
                return
            await wait_event(self._poke, self._settings.retry_period_s)
            self._poke.clear()

    def close(self) -> None:
        """Let :meth:`run` return after the step it is in (then :meth:`release`): a step cut
        short could leave the replica's jobs half stood down and the Lease held."""
        self._closing = True
        self.poke()

    async def step(self) -> Move:
        """One read of the Lease and the move it leads to, carried out."""
        try:
            lease = await self._api.read_lease(
                self._lease.namespace, self._lease.name, self._call_timeout()
            )
        except (ApiException, OSError) as exc:
            logger.debug("leader election: could not read the Lease: %s", exc)
            now = self._clock()
            move = decide(None, self._me(), now, self._settings, read_failed=True)
            lease = None
        else:
            now = self._clock()
            move = decide(self._seen(lease, now), self._me(), now, self._settings)
        await self._carry_out(move, lease, now)
        return move

    def _call_timeout(self) -> float:
        """How long one API call of the election may take: for the leader, no later than its
        renew deadline (it must know by then whether it still leads)."""
        limit = self._settings.renew_deadline_s
        if self._leading and self._renewed_at is not None:
            left = self._renewed_at + self._settings.renew_deadline_s - self._clock()
            limit = min(limit, max(left, MIN_CALL_S))
        return limit

    async def release(self) -> None:
        """Stop leading, if it does, and release the Lease (the operator stops)."""
        if not self._leading:
            return
        await self._stop_leading(lost=False)
        try:
            lease = await self._api.read_lease(
                self._lease.namespace, self._lease.name, self._settings.renew_deadline_s
            )
        except (ApiException, OSError) as exc:
            logger.warning("leader election: could not release the Lease: %s", exc)
            return
        await self._release(lease)

    def _me(self) -> Candidate:
        return Candidate(self.identity, self._eligible(), self._leading, self._renewed_at)

    def _seen(self, lease: dict[str, Any] | None, now: float) -> SeenLease | None:
        if lease is None:
            self._seen_version = None
            return None
        version = lease["metadata"].get("resourceVersion")
        if version != self._seen_version:
            self._seen_version, self._observed_at = version, now
        spec = lease.get("spec") or {}
        return SeenLease(
            holder=spec.get("holderIdentity") or "",
            duration_s=int(spec.get("leaseDurationSeconds") or self._settings.lease_duration_s),
            observed_at=self._observed_at,
        )

    async def _carry_out(self, move: Move, lease: dict[str, Any] | None, now: float) -> None:
        if move is Move.WAIT:
            return
        if move is Move.LOST:
            logger.error(
                "leader election: %s lost the Lease (not renewed within %.1f s, or taken): "
                "it stops acting on jobs",
                self.identity,
                self._settings.renew_deadline_s,
            )
            await self._stop_leading(lost=True)
            return
        if move is Move.STEP_DOWN:
            logger.warning(
                "leader election: %s steps down (its pod is not ready, or it stops)",
                self.identity,
            )
            await self._stop_leading(lost=False)
            await self._release(lease)
            return
        previous = ((lease or {}).get("spec") or {}).get("holderIdentity") or ""
        written = await self._write(lease, holder=self.identity, now=now)
        if written is None:
            return
        if not self._leading:
            self._announce(written, previous)
            self._leading = True
            logger.info(
                "leader election: %s leads (the Lease's previous holder: %s)",
                self.identity,
                previous or "none",
            )
            await self._leadership.lead()

    async def _write(
        self, lease: dict[str, Any] | None, *, holder: str, now: float
    ) -> dict[str, Any] | None:
        """Write the Lease with ``holder`` (renewing it when it already holds it); the Lease
        as written (None: the API server did not take it)."""
        wall = _micro_time(self._wall_clock())
        spec = dict((lease or {}).get("spec") or {})
        if spec.get("holderIdentity") != holder:
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (
                1 if lease is not None else 0
            )
            spec["acquireTime"] = wall
        spec.update(
            holderIdentity=holder,
            leaseDurationSeconds=self._settings.lease_duration_s,
            renewTime=wall,
        )
        metadata: dict[str, Any] = {"name": self._lease.name, "namespace": self._lease.namespace}
        if lease is not None:
            metadata["resourceVersion"] = lease["metadata"]["resourceVersion"]
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata}
        try:
            written = await self._api.write_lease(
                self._lease.namespace, {**body, "spec": spec}, self._call_timeout()
            )
        except (ApiException, OSError) as exc:
            logger.debug("leader election: could not write the Lease: %s", exc)
            return None
        self._seen_version = written["metadata"].get("resourceVersion")
        self._observed_at = now
        self._renewed_at = now
        return written

    def _announce(self, lease: dict[str, Any], previous: str) -> None:
        """An Event on the Lease saying who leads now (in the background: the election's
        loop never waits for it)."""
        message = f"{self.identity} leads (after {previous or 'nobody'})"
        task = asyncio.create_task(self._api.lease_event(lease, "LeaderElection", message))
        self._announcing.add(task)
        task.add_done_callback(self._announcing.discard)

    async def _release(self, lease: dict[str, Any] | None) -> None:
        """Empty the holder of a Lease this replica holds, with a one-second duration, so that
        a standby takes it at its next read."""
        spec = (lease or {}).get("spec") or {}
        if lease is None or spec.get("holderIdentity") != self.identity:
            return
        released = {
            **lease,
            "spec": {**spec, "holderIdentity": "", "leaseDurationSeconds": 1},
        }
        try:
            await self._api.write_lease(
                self._lease.namespace, released, self._settings.renew_deadline_s
            )
        except (ApiException, OSError) as exc:
            logger.warning("leader election: could not release the Lease: %s", exc)
            return
        logger.info("leader election: %s released the Lease", self.identity)

    async def _stop_leading(self, *, lost: bool) -> None:
        if not self._leading:
            return
        self._leading = False
        self._renewed_at = None
        await self._leadership.stand_down(lost=lost)
