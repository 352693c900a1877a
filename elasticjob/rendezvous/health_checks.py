"""One job's health checks at the rendezvous service: gathers the pods that start at about
the same time into cohorts, holds their long-polls, and carries out the decisions of
``health_rule.py`` (when a cohort closes, each member's verdict) as time passes and reports
arrive. The front end tells it which pods await their check (:meth:`HealthChecks.expect`)
and hears every final verdict (:class:`HealthListener`). A pod that passed is told so only
once the front end has admitted it (:meth:`HealthChecks.admitted`: the operator labels its pod
first), so a front end that dies in between leaves no pod that passed without a trace: the
pod's next request reaches a service that does not know its cohort, and it checks again.

Everything runs on one asyncio event loop; nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections import Counter, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Final, Protocol

from elasticjob.rendezvous.health_rule import (
    PEERS_KEPT,
    HealthPolicy,
    decide_gather,
    judge_cohort,
    kept_as_peers,
)
from elasticjob.rendezvous.rendezvous_types import Refusal, RequestRefused
from elasticjob.rendezvous.wakeup import LongPolls, Wakeup
from elasticjob.wire.health import (
    CohortRequest,
    CohortResponse,
    HealthFigures,
    HealthReport,
    HealthVerdict,
    VerdictStatus,
)

logger = logging.getLogger(__name__)

VERDICTS_KEPT: Final = 4096
"""How many pods' final verdicts a job remembers (the oldest are forgotten first)."""


class HealthListener(Protocol):
    """Who admits the pods (the operator's pod reconciler). Called on the event loop."""

    def on_health_verdict(
        self,
        host: str,
        verdict: HealthVerdict,
        seconds: float | None,
        figures: HealthFigures | None,
    ) -> None:
        """``host`` passed or failed its check (``seconds``: how long the check took, as the
        pod measured it; None: it never reported). A pod that passed waits until the
        listener calls :meth:`HealthChecks.admitted`. Pods that were gone before they
        reported are not told of: the front end handled their end already."""


@dataclass
class _Cohort:
    number: int
    members: tuple[str, ...]
    store: tuple[str, int]
    prefix: str
    deadline: float
    reports: dict[str, HealthReport] = field(default_factory=dict)


class HealthChecks:
    """The health checks of one job (see the module docstring)."""

    def __init__(
        self,
        job: str,
        policy: HealthPolicy,
        listener: HealthListener,
        polls: LongPolls,
        clock: Callable[[], float],
    ) -> None:
        self._job = job
        self.policy = policy
        self._listener = listener
        self._polls = polls
        self._clock = clock
        self._changed = Wakeup()
        self._expected: set[str] = set()
        """The pods that await their check (as the front end last said)."""
        self._coming: set[str] = set()
        """The pods whose check is to come: created, not running yet (as the front end last
        said): a cohort being gathered waits for them too."""
        self._gathering: dict[str, tuple[str, int]] = {}
        """The pods gathered into the next cohort, with their store endpoints (in order)."""
        self._opened_at = 0.0
        self._cohorts: dict[int, _Cohort] = {}
        self._cohort_of: dict[str, int] = {}
        self._attempts: Counter[str] = Counter()
        self._verdicts: dict[str, HealthVerdict] = {}
        """Final verdicts (passed or failed) by pod."""
        self._retries: dict[str, tuple[int, str]] = {}
        """Pods told to check again, with the cohort that was inconclusive and why."""
        self._history: deque[HealthFigures] = deque(maxlen=PEERS_KEPT)
        self._admitting: set[str] = set()
        """Pods that passed, told to the listener and not admitted yet."""
        self._last_cohort = 0
        self._nonce = secrets.token_hex(4)
        """In every cohort's store prefix: a restarted service's cohort 1 is not its
        predecessor's (whose store may still hold the old cohort's keys)."""
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    # ---- the front end -----------------------------------------------------------------

    def expect(self, hosts: Iterable[str], coming: Iterable[str] = ()) -> None:
        """The pods that await their check now, and those whose check is to come (their
        pods not running yet): a cohort closes once all of them asked, or after gathering
        for the policy's ``gather_s``, so that pods started together are checked together
        (and compared) though one runs a little later; a member of a cohort that is no longer
        awaited (its pod failed or is gone) counts as not reporting."""
        self._expected = set(hosts)
        self._coming = set(coming) - self._expected
        for host in [h for h in self._gathering if h not in self._expected]:
            del self._gathering[host]
        for kept in (self._attempts, self._retries):
            for host in [h for h in kept if h not in self._expected]:
                del kept[host]
        self._admitting &= self._expected
        self.tick()

    def admitted(self, host: str) -> None:
        """The front end admitted ``host``, which passed: its check is told so."""
        self._admitting.discard(host)
        self._changed.fire()

    def close(self) -> None:
        """The job leaves the service: nothing is judged or told any more, and the pending
        long-polls answer as their wait ran out."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._changed.fire()

    def verdict(self, host: str) -> HealthVerdict | None:
        """The final verdict on ``host`` (None: none yet)."""
        return self._verdicts.get(host)

    def tick(self) -> None:
        """Close the cohort being gathered and judge the cohorts that are due; wake the
        long-polls that have news. Called on every change and by the timer."""
        if self._closed:
            return
        now = self._clock()
        if self._gathering:
            waiting = self._expected | self._coming
            still = waiting - self._gathering.keys() - self._verdicts.keys()
            still -= {h for h in still if h in self._cohort_of}
            if decide_gather(len(still), self._opened_at, now, self.policy.gather_s) is None:
                self._close(now)
        for number in [n for n, c in self._cohorts.items() if self._complete(c, now)]:
            self._judge(self._cohorts.pop(number))
        self._changed.fire()
        self._arm(now)

    # ---- the pods ----------------------------------------------------------------------

    async def join(self, request: CohortRequest) -> CohortResponse:
        """Gather the pod into the next cohort and wait for it to close (see
        ``CohortRequest``). Raises :class:`RequestRefused` for a pod that does not await
        its check (retryable while the front end has not seen it start)."""
        host = self._awaiting(request.hostname)
        if request.wait_seconds > 0:
            self._polls.check_room()  # refused before anything changes
        if host not in self._gathering and host not in self._cohort_of:
            self._retries.pop(host, None)
            if not self._gathering:
                self._opened_at = self._clock()
            self._gathering[host] = (request.address, request.store_port)
            self.tick()
        return await self._polls.wait(
            lambda: self._assignment(host), request.wait_seconds, self._changed, CohortResponse
        )

    async def report(self, report: HealthReport) -> HealthVerdict:
        """Take the pod's report in its cohort and wait for the cohort's verdict on it.
        RETRY for a pod this service gave no cohort (it restarted meanwhile); raises
        :class:`RequestRefused` for a pod that is not a member of ``report.cohort``."""
        host = report.hostname
        if (known := self._verdict_in(host, report.cohort)) is not None:
            return known  # a retried request: its answer was lost
        if host in self._admitting:  # passed: it waits until the front end admitted it
            return await self._polls.wait(
                lambda: self._verdict_in(host, report.cohort),
                report.wait_seconds,
                self._changed,
                lambda: HealthVerdict(status=VerdictStatus.PENDING),
            )
        self._awaiting(host)
        assigned = self._cohort_of.get(host)
        if assigned is None:  # the service restarted since it was assigned one
            return HealthVerdict(
                status=VerdictStatus.RETRY, reason=f"cohort {report.cohort} is not known here"
            )
        if assigned != report.cohort:
            raise RequestRefused(
                Refusal.INVALID_REPORT, f"{host} is not a member of cohort {report.cohort}"
            )
        if report.wait_seconds > 0:
            self._polls.check_room()  # refused before anything changes
        cohort = self._cohorts[assigned]
        if host not in cohort.reports:
            cohort.reports[host] = report
            self.tick()
        pending = HealthVerdict(status=VerdictStatus.PENDING)
        return await self._polls.wait(
            lambda: self._verdict_in(host, report.cohort),
            report.wait_seconds,
            self._changed,
            lambda: pending,
        )

    # ---- the executor ------------------------------------------------------------------

    def _awaiting(self, host: str) -> str:
        if host in self._verdicts and host not in self._admitting:
            raise RequestRefused(
                Refusal.UNKNOWN_WORKER, f"{host} was judged already ({self._verdicts[host].status})"
            )
        if host not in self._expected:
            raise RequestRefused(
                Refusal.NOT_ADMITTED_YET, f"{host} does not await a health check (yet)"
            )
        return host

    def _assignment(self, host: str) -> CohortResponse | None:
        number = self._cohort_of.get(host)
        if number is None:
            return None
        cohort = self._cohorts[number]
        return CohortResponse(
            cohort=number,
            rank=cohort.members.index(host),
            size=len(cohort.members),
            store_address=cohort.store[0],
            store_port=cohort.store[1],
            store_prefix=cohort.prefix,
            deadline_seconds=max(0.0, cohort.deadline - self._clock()),
        )

    def _verdict_in(self, host: str, number: int) -> HealthVerdict | None:
        if host in self._admitting:
            return None
        if (final := self._verdicts.get(host)) is not None:
            return final
        retry = self._retries.get(host)
        if retry is not None and retry[0] == number:
            return HealthVerdict(status=VerdictStatus.RETRY, reason=retry[1])
        return None

    def _close(self, now: float) -> None:
        self._last_cohort += 1
        members = tuple(self._gathering)
        store = self._gathering[members[0]]
        number = self._last_cohort
        prefix = f"{self._job}/health/{self._nonce}/cohort-{number}/"
        self._cohorts[number] = _Cohort(number, members, store, prefix, now + self.policy.cohort_s)
        for host in members:
            self._cohort_of[host] = self._last_cohort
            self._attempts[host] += 1
        self._gathering = {}
        logger.info(
            "job %s: health cohort %d: %s", self._job, self._last_cohort, ", ".join(members)
        )

    def _complete(self, cohort: _Cohort, now: float) -> bool:
        return now >= cohort.deadline or all(
            m in cohort.reports or m not in self._expected for m in cohort.members
        )

    def _judge(self, cohort: _Cohort) -> None:
        gone = {m for m in cohort.members if m not in self._expected}
        history = list(self._history)
        verdicts = judge_cohort(
            cohort.members, cohort.reports, history, self._attempts, self.policy, gone=gone
        )
        self._history.extend(kept_as_peers(cohort.reports, verdicts, history))
        for host, verdict in verdicts.items():
            self._cohort_of.pop(host, None)
            report = cohort.reports.get(host)
            if verdict.status is VerdictStatus.RETRY:
                self._retries[host] = (cohort.number, verdict.reason)
                logger.info("job %s: %s checks again: %s", self._job, host, verdict.reason)
                continue
            self._verdicts[host] = verdict
            while len(self._verdicts) > VERDICTS_KEPT:
                del self._verdicts[next(iter(self._verdicts))]
            if report is None and host in gone:
                continue  # its pod failed or is gone: the front end told its end already
            figures = None if report is None else report.figures
            if verdict.status is VerdictStatus.PASSED:
                self._admitting.add(host)
            seconds = None if report is None else report.seconds
            self._listener.on_health_verdict(host, verdict, seconds, figures)

    def _arm(self, now: float) -> None:
        """Have the timer tick at the next moment something is due."""
        due = [c.deadline for c in self._cohorts.values()]
        if self._gathering:
            due.append(self._opened_at + self.policy.gather_s)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if due:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # no loop (a unit test drives tick() itself)
            self._timer = loop.call_later(max(0.0, min(due) - now), self.tick)
