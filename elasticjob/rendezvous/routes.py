"""HTTP routes of the rendezvous service: parse, validate and authorize, then call the job.

Every error is answered with a JSON :class:`~elasticjob.wire.messages.ErrorResponse`. A
request is checked in this order, and refused at the first check it fails, before anything of
the job is called, so a rejected request never changes any job's state:

1. a bearer token (401 without one);
2. its protocol version (:data:`~elasticjob.wire.protocol.PROTOCOL_HEADER`: 426, naming both
   versions, for none or one other than the service's; 400 for one that is not a number);
3. the token, one of the job's credentials (``job_credentials.py``: 403 for an unknown job
   and for another job's credential alike, so job names cannot be probed; while the service
   takes its jobs back after a restart, 503 with ``Retry-After`` for both alike: a job not
   served yet may be one of them);
4. the job's rate (429 with ``Retry-After``, see ``limits.py``);
5. its query or body (400 for malformed JSON, a repeated key or a body that ended early,
   408 for one not received in time, 413 for one too large, 422 for a value the strict wire
   model refuses, 429 beyond the job's bodies in flight: ``request_bodies.py``);
6. who the credential speaks for (403 unless a request that changes state speaks for the
   credential's own host, its body's ``hostname``; progress is the round's rank 0's only;
   the reader token reads and speaks for no worker);
7. what the job refuses (:class:`~elasticjob.rendezvous.rendezvous_types.RequestRefused`: 403
   for a worker its driver did not launch (503 with ``Retry-After`` before the job's first own
   round), 409 for a round not published yet, another store endpoint for the same round or a
   repeated result, 429 beyond the job's long-polls).

A client that goes away is answered like any other (to nobody) and logged as one line.

A connection is kept alive after an answered request (a worker sends its heartbeats and other
short requests over one connection, see ``transport.py`` for its bounds); a refused request's
answer (any status from 400) closes its connection, so a client that is refused holds no
connection open and an unread body is never left on a connection.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Annotated, Final, Protocol, TypeVar

from aiohttp import hdrs, typedefs, web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from elasticjob.rendezvous.health_checks import HealthChecks
from elasticjob.rendezvous.job_credentials import Speaker
from elasticjob.rendezvous.jobs import InMemoryJobRendezvous
from elasticjob.rendezvous.rendezvous_types import Refusal, RequestRefused
from elasticjob.rendezvous.request_bodies import (
    BODY_TIMEOUT_S,
    ApiError,
    invalid,
    json_response,
    parse_body,
)
from elasticjob.rendezvous.stats import RequestStats
from elasticjob.wire.health import CohortRequest, HealthReport
from elasticjob.wire.messages import (
    ExitReport,
    HeartbeatRequest,
    ProgressRequest,
    RendezvousRequest,
    ResultRequest,
)
from elasticjob.wire.protocol import API_PREFIX, PROTOCOL_HEADER, PROTOCOL_VERSION

logger = logging.getLogger(__name__)

_REFUSAL_STATUS: Final = {
    Refusal.UNKNOWN_WORKER: 403,
    Refusal.NOT_ADMITTED_YET: 503,
    Refusal.FUTURE_ROUND: 409,
    Refusal.ENDPOINT_CHANGED: 409,
    Refusal.RESULT_REPEATED: 409,
    Refusal.TOO_MANY_WAITS: 429,
    Refusal.TOO_MANY_BODIES: 429,
    Refusal.INVALID_REPORT: 422,
}

_Model = TypeVar("_Model", bound=BaseModel)

_LONG_POLL: Final = web.RequestKey("elasticjob.long_poll", bool)
"""Request key a handler sets when the request may wait for news (left out of the latency)."""

RETRY_AFTER_S: Final = 1
"""``Retry-After`` of the 503 answered for a job that is not served yet while the service's
owner is still adopting its jobs (after a restart)."""


class _NoticesQuery(BaseModel):
    """Query of ``GET notices``: strings, so parsed leniently, but ``after`` must be digits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    after: Annotated[str, Field(pattern=r"^[0-9]{1,19}$")] = "0"
    wait: Annotated[float, Field(ge=0, le=60, allow_inf_nan=False)] = 0.0


def _bearer_token(request: web.Request) -> str:
    header = request.headers.get(hdrs.AUTHORIZATION)
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not token or " " in token:
        raise ApiError(
            401,
            "missing or malformed Authorization header (expected 'Bearer <token>')",
            headers={hdrs.WWW_AUTHENTICATE: "Bearer"},
        )
    return token


def protocol_refusal(sent: str | None) -> ApiError | None:
    """The refusal of a request whose :data:`~elasticjob.wire.protocol.PROTOCOL_HEADER` is
    ``sent`` (None: the request has none), or None for the service's own version, the only
    one it accepts."""
    upgrade = "run a worker image of the operator's release"
    if sent is None:
        return ApiError(
            426,
            f"the worker sends no rendezvous protocol version (no {PROTOCOL_HEADER} header), "
            f"this service speaks {PROTOCOL_VERSION}: {upgrade}",
        )
    if not sent.isascii() or not sent.isdecimal() or len(sent) > 6:
        return ApiError(400, f"{PROTOCOL_HEADER} must be a protocol version number")
    if int(sent) != PROTOCOL_VERSION:
        return ApiError(
            426,
            f"the worker speaks rendezvous protocol {int(sent)}, this service speaks "
            f"{PROTOCOL_VERSION}: {upgrade}",
        )
    return None


def _retry_after(seconds: float) -> dict[str, str]:
    return {hdrs.RETRY_AFTER: str(max(1, math.ceil(seconds)))}


def _logged_path(request: web.Request) -> str:
    """The path as sent (percent-encoded, so one line), cut to a sane length."""
    return request.rel_url.raw_path[:200]


def _route_name(request: web.Request) -> str:
    resource = request.match_info.route.resource
    return f"{request.method} {resource.canonical}" if resource is not None else "unmatched"


class _Api:
    """The request handlers, over a live view of the service's jobs."""

    def __init__(
        self,
        jobs: Mapping[str, InMemoryJobRendezvous],
        adopting: Callable[[], bool],
        body_timeout: float,
    ) -> None:
        self._jobs = jobs
        self._adopting = adopting
        self._body_timeout = body_timeout

    async def body(
        self, request: web.Request, job: InMemoryJobRendezvous, model: type[_Model]
    ) -> _Model:
        """The request's body as ``model`` (see ``request_bodies.parse_body``)."""
        return await parse_body(request, job.bodies, model, self._body_timeout)

    def authorize(self, request: web.Request) -> tuple[InMemoryJobRendezvous, Speaker]:
        """The job named in the path and who the request's credential speaks for, if the
        request speaks the service's protocol, carries one of the job's credentials and is
        within the job's rate. A request of another protocol is refused (426); when it
        carries a credential of the job, the job hears of it: its workers run an image of
        another release, and it cannot run."""
        token = _bearer_token(request)
        refusal = protocol_refusal(request.headers.get(PROTOCOL_HEADER))
        name = request.match_info["job"]
        job = self._jobs.get(name)
        speaker = None if job is None else job.key.speaker(token)
        if job is None or speaker is None:
            if self._adopting():  # the same answer for a job not served yet and a wrong token
                raise ApiError(
                    503,
                    f"job {name!r} is not served yet (the service is taking its jobs back "
                    "after a restart): retry",
                    headers=_retry_after(RETRY_AFTER_S),
                )
            raise refusal or ApiError(403, f"the token is not valid for job {name!r}")
        if refusal is not None:
            if refusal.status == 426:  # one of the job's own workers, of another release
                job.refuse_incompatible(refusal.error)
            raise refusal
        wait = job.take_request()
        if wait > 0:
            raise ApiError(
                429, f"job {name!r} sends more requests than its rate", headers=_retry_after(wait)
            )
        return job, speaker

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def rendezvous(self, request: web.Request) -> web.Response:
        job, speaker = self.authorize(request)
        body = _spoken_for(speaker, await self.body(request, job, RendezvousRequest))
        request[_LONG_POLL] = body.wait_seconds > 0
        return json_response(await job.rendezvous(body))

    async def notices(self, request: web.Request) -> web.Response:
        job, _ = self.authorize(request)
        for key in request.query:
            if len(request.query.getall(key)) > 1:
                raise ApiError(400, f"query parameter {key!r} is given more than once")
        try:
            query = _NoticesQuery.model_validate(dict(request.query))
        except ValidationError as exc:
            raise invalid("query", exc) from exc
        request[_LONG_POLL] = query.wait > 0
        return json_response(await job.notices(int(query.after), query.wait))

    async def results(self, request: web.Request) -> web.Response:
        job, speaker = self.authorize(request)
        job.report_result(_spoken_for(speaker, await self.body(request, job, ResultRequest)))
        return web.Response(status=204)

    async def exits(self, request: web.Request) -> web.Response:
        job, speaker = self.authorize(request)
        answer = job.report_exit(_spoken_for(speaker, await self.body(request, job, ExitReport)))
        return json_response(answer)

    async def progress(self, request: web.Request) -> web.Response:
        job, speaker = self.authorize(request)
        body = await self.body(request, job, ProgressRequest)
        rank_zero = job.rank_zero_host
        if rank_zero is None or not speaker.speaks_for(rank_zero):
            raise ApiError(403, f"{speaker} does not speak for rank 0 of the round in force")
        job.report_progress(body)
        return web.Response(status=204)

    async def heartbeat(self, request: web.Request) -> web.Response:
        job, speaker = self.authorize(request)
        job.report_heartbeat(_spoken_for(speaker, await self.body(request, job, HeartbeatRequest)))
        return web.Response(status=204)

    async def round(self, request: web.Request) -> web.Response:
        return json_response(self.authorize(request)[0].round_info())

    async def plan(self, request: web.Request) -> web.Response:
        return json_response(self.authorize(request)[0].planned_round())

    def _health_checks(
        self, request: web.Request
    ) -> tuple[InMemoryJobRendezvous, Speaker, HealthChecks]:
        job, speaker = self.authorize(request)
        if job.health_checks is None:
            raise ApiError(404, f"job {job.job!r} runs no health checks")
        return job, speaker, job.health_checks

    async def health_cohort(self, request: web.Request) -> web.Response:
        job, speaker, checks = self._health_checks(request)
        body = _spoken_for(speaker, await self.body(request, job, CohortRequest))
        request[_LONG_POLL] = body.wait_seconds > 0
        return json_response(await checks.join(body))

    async def health_report(self, request: web.Request) -> web.Response:
        job, speaker, checks = self._health_checks(request)
        body = _spoken_for(speaker, await self.body(request, job, HealthReport))
        request[_LONG_POLL] = body.wait_seconds > 0
        return json_response(await checks.report(body))


class _SpokenFor(Protocol):
    """A request body that speaks for one host."""

    @property
    def hostname(self) -> str: ...


_Spoken = TypeVar("_Spoken", bound=_SpokenFor)


def _spoken_for(speaker: Speaker, body: _Spoken) -> _Spoken:
    """``body``, if ``speaker`` may speak for its ``hostname`` (else 403: a credential speaks
    only for its own host, the reader token for none)."""
    if not speaker.speaks_for(body.hostname):
        raise ApiError(403, f"{speaker} does not speak for {body.hostname!r}")
    return body


def _stats_and_errors(stats: RequestStats) -> typedefs.Middleware:
    @web.middleware
    async def middleware(request: web.Request, handler: typedefs.Handler) -> web.StreamResponse:
        started = time.monotonic()
        try:
            response = await handler(request)
        except ApiError as exc:
            response = exc.response()
        except RequestRefused as exc:
            status = _REFUSAL_STATUS[exc.refusal]
            headers = _retry_after(RETRY_AFTER_S) if status in (429, 503) else None
            response = ApiError(status, str(exc), headers=headers).response()
        except web.HTTPException as exc:
            allow = {str(hdrs.ALLOW): exc.headers[hdrs.ALLOW]} if hdrs.ALLOW in exc.headers else {}
            response = ApiError(exc.status, exc.reason, headers=allow).response()
        except Exception:
            logger.exception("%s %s failed", request.method, _logged_path(request))
            response = ApiError(500, "internal error").response()
        if response.status >= 400:
            logger.info("%s %s -> %d", request.method, _logged_path(request), response.status)
        response.headers[PROTOCOL_HEADER] = str(PROTOCOL_VERSION)
        if response.status >= 400:
            response.force_close()
        stats.record(
            _route_name(request),
            response.status,
            time.monotonic() - started,
            long_poll=request.get(_LONG_POLL, False),
        )
        return response

    return middleware


def create_app(
    jobs: Mapping[str, InMemoryJobRendezvous],
    stats: RequestStats,
    adopting: Callable[[], bool],
    *,
    body_timeout: float = BODY_TIMEOUT_S,
) -> web.Application:
    """The aiohttp application serving ``jobs`` (a live mapping: jobs added to or removed
    from it later are served or not accordingly) and counting requests in ``stats``.

    A request's body must arrive within ``body_timeout`` seconds of its headers (408). While
    ``adopting()`` is true, a request for a job that is not in ``jobs`` gets 503 with
    ``Retry-After`` instead of 403.

    On application shutdown every job's pending long-polls are answered at once.
    """
    api = _Api(jobs, adopting, body_timeout)
    app = web.Application(middlewares=[_stats_and_errors(stats)])
    job_path = f"{API_PREFIX}/jobs/{{job}}"
    # The router tries routes in this order: the most frequent first (every worker beats
    # each heartbeat interval and keeps a notices poll open).
    app.router.add_route("POST", f"{job_path}/heartbeat", api.heartbeat)
    app.router.add_route("GET", f"{job_path}/notices", api.notices)
    app.router.add_route("POST", f"{job_path}/rendezvous", api.rendezvous)
    app.router.add_route("POST", f"{job_path}/progress", api.progress)
    app.router.add_route("POST", f"{job_path}/results", api.results)
    app.router.add_route("POST", f"{job_path}/exits", api.exits)
    app.router.add_route("GET", f"{job_path}/round", api.round)
    app.router.add_route("GET", f"{job_path}/plan", api.plan)
    app.router.add_route("POST", f"{job_path}/health/cohort", api.health_cohort)
    app.router.add_route("POST", f"{job_path}/health/report", api.health_report)
    app.router.add_route("GET", "/healthz", api.healthz)

    async def close_waits(_: web.Application) -> None:
        for job in list(jobs.values()):
            job.close_waits()

    app.on_shutdown.append(close_waits)
    return app
