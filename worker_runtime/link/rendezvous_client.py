"""A small synchronous client of the rendezvous service, for worker processes.

It uses only the standard library (the worker image carries no aiohttp), sends the job's
bearer token and its protocol version (:data:`~elasticjob.wire.protocol.PROTOCOL_HEADER`) on every
request, verifies an ``https://`` service against the CA it is given (else the system's), and
retries connection errors, 5xx and 429 answers with bounded exponential backoff (a
``Retry-After`` is honoured: the service answers it for a job it is still taking back after a
restart, and to a job over its rate), so a restarting operator does not kill training. Any
other refusal (for example ``426``: the service speaks another protocol version) raises
:class:`RendezvousClientError` with the service's message. Progress is sent at most once per
:data:`PROGRESS_INTERVAL_S`; reports in between are dropped.

Each calling thread keeps one HTTP/1.1 connection open between its requests (the heartbeat
thread, the notices thread, the progress thread and the training thread each their own: an
``http.client`` connection is never shared between threads), so a heartbeat costs neither
side a new connection (nor a TLS handshake). The service closes a connection idle for its
keep-alive timeout and after every refusal; a connection the service has closed is replaced
before the next request, and a request that fails on a reused connection because the service
closed it meanwhile is sent once more on a fresh one at once (other failures follow the retry
policy above).
"""

from __future__ import annotations

import http.client
import logging
import select
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable

from pydantic import BaseModel

from elasticjob.backoff import Backoff
from elasticjob.wire.health import CohortRequest, CohortResponse, HealthReport, HealthVerdict
from elasticjob.wire.messages import (
    ExitAnswer,
    ExitReport,
    HeartbeatRequest,
    NoticesResponse,
    PlannedRound,
    ProgressRequest,
    RendezvousRequest,
    RendezvousResponse,
    RendezvousStatus,
    ResultRequest,
    RoundInfo,
)
from elasticjob.wire.protocol import API_PREFIX, PROTOCOL_HEADER, PROTOCOL_VERSION
from elasticjob.wire.strict_json import parse_json
from elasticjob.worker_contract import WorkerConfig

logger = logging.getLogger(__name__)

BACKOFF = Backoff(initial_s=0.05, factor=2.0, max_s=2.0)
"""The pauses between the tries of one request (a ``Retry-After`` the service sends is
taken instead)."""
LONG_POLL_S = 20.0
"""How long one rendezvous request waits at the service for a round to form."""


class RendezvousClientError(RuntimeError):
    """The rendezvous service refused a request or stayed unreachable past the deadline."""


class RendezvousClient:
    """Talks to one job's endpoints of the rendezvous service."""

    def __init__(
        self,
        url: str,
        job: str,
        token: str,
        *,
        ca_pem: str | None = None,
        retry_deadline_s: float = 120.0,
        connect_timeout_s: float = 5.0,
    ) -> None:
        """``ca_pem``: PEM text of the CA certificate(s) an ``https://`` service is verified
        against (None: the system's). Raises :class:`ValueError` for a URL that is not
        ``http(s)://host[:port]`` or a CA that does not load."""
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"rendezvous URL must look like http(s)://host:port, got {url!r}")
        self._tls: ssl.SSLContext | None = None
        if parsed.scheme == "https":
            try:
                self._tls = ssl.create_default_context(cadata=ca_pem)
            except (ssl.SSLError, ValueError) as exc:
                raise ValueError(f"the rendezvous CA certificate does not load: {exc}") from None
        self._url = f"{parsed.scheme}://{parsed.netloc}"
        self._host = parsed.hostname
        self._port = parsed.port or (443 if self._tls else 80)
        self._base = f"{API_PREFIX}/jobs/{urllib.parse.quote(job, safe='')}"
        self._headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            PROTOCOL_HEADER: str(PROTOCOL_VERSION),
        }
        self._retry_deadline_s = retry_deadline_s
        self._connect_timeout_s = connect_timeout_s
        self._local = threading.local()
        """``conn``: the calling thread's :class:`_Connection` (absent until its first request)."""

    @classmethod
    def for_worker(cls, config: WorkerConfig) -> RendezvousClient:
        """The client of the job a worker's contract names (its URL, job, token and CA)."""
        return cls(config.rendezvous_url, config.job, config.token, ca_pem=config.rendezvous_ca)

    def __repr__(self) -> str:
        return f"RendezvousClient({self._url}{self._base})"

    def rendezvous(
        self, request: RendezvousRequest, *, retry_for_s: float | None = None
    ) -> RendezvousResponse:
        """Long-poll for the worker's next round (see ``RendezvousRequest``). Retryable
        answers (the service unreachable, or not admitting this worker yet: its pod may start
        before the driver plans it) are retried for ``retry_for_s`` (default: the client's
        retry deadline)."""
        data = self._request(
            "POST", "/rendezvous", request, wait_s=request.wait_seconds, retry_for_s=retry_for_s
        )
        return parse_json(RendezvousResponse, data)

    def await_round(
        self,
        request: RendezvousRequest,
        *,
        deadline: float,
        stopped: Callable[[], bool] = lambda: False,
    ) -> RendezvousResponse | None:
        """Long-poll with ``request`` (each try waiting :data:`LONG_POLL_S` at the service)
        until the service answers other than PENDING: a round (ASSIGNED), or REMOVED or
        FINISHED. None once ``stopped()`` (looked at between tries). Raises RuntimeError
        when ``deadline`` (``time.monotonic()``) passes first."""
        request = request.model_copy(update={"wait_seconds": LONG_POLL_S})
        while not stopped():
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"no round after round {request.after_round} was assigned in time to "
                    f"{request.hostname}[{request.local_rank}] ({self!r})"
                )
            response = self.rendezvous(request, retry_for_s=max(deadline - time.monotonic(), 1.0))
            if response.status is not RendezvousStatus.PENDING:
                return response
        return None

    def notices(self, after_seq: int, wait_seconds: float) -> NoticesResponse:
        """Long-poll for notices newer than ``after_seq``."""
        path = f"/notices?after={after_seq}&wait={wait_seconds}"
        return parse_json(NoticesResponse, self._request("GET", path, None, wait_s=wait_seconds))

    def report_result(self, request: ResultRequest, *, retry_for_s: float | None = None) -> None:
        """Say how this worker's process ends, retrying for ``retry_for_s`` (default: the
        client's retry deadline)."""
        self._request("POST", "/results", request, retry_for_s=retry_for_s)

    def report_exit(self, report: ExitReport, *, retry_for_s: float) -> ExitAnswer:
        """Say, for a pod's slot supervisor, that one of its slots' processes ended, retrying
        for ``retry_for_s``; return what the pod is to do about it."""
        answer = self._request("POST", "/exits", report, retry_for_s=retry_for_s)
        return parse_json(ExitAnswer, answer)

    def report_progress(self, request: ProgressRequest) -> None:
        """Send rank 0's progress once, without retrying: the next report is the retry (see
        ``progress.py``). Raises :class:`RendezvousClientError` if it did not arrive."""
        self._request("POST", "/progress", request, retry_for_s=0.0)

    def heartbeat(self, request: HeartbeatRequest) -> None:
        """Send one heartbeat, without retrying: the next beat is the retry. Raises
        :class:`RendezvousClientError` if it did not arrive."""
        self._request("POST", "/heartbeat", request, retry_for_s=0.0)

    def round_info(self) -> RoundInfo:
        return parse_json(RoundInfo, self._request("GET", "/round", None))

    def planned_round(self, *, retry_for_s: float) -> PlannedRound:
        """The round the driver plans with the workers it is adding."""
        data = self._request("GET", "/plan", None, retry_for_s=retry_for_s)
        return parse_json(PlannedRound, data)

    def health_cohort(self, request: CohortRequest, *, retry_for_s: float) -> CohortResponse:
        """Long-poll for this pod's health-check cohort (``cohort`` 0: still gathering)."""
        data = self._request(
            "POST", "/health/cohort", request, wait_s=request.wait_seconds, retry_for_s=retry_for_s
        )
        return parse_json(CohortResponse, data)

    def health_report(self, report: HealthReport, *, retry_for_s: float) -> HealthVerdict:
        """Send this pod's health report and long-poll for the verdict (PENDING: not yet)."""
        data = self._request(
            "POST", "/health/report", report, wait_s=report.wait_seconds, retry_for_s=retry_for_s
        )
        return parse_json(HealthVerdict, data)

    def _request(
        self,
        method: str,
        path: str,
        body: BaseModel | None,
        *,
        wait_s: float = 0.0,
        retry_for_s: float | None = None,
    ) -> bytes:
        payload = body.model_dump_json().encode() if body is not None else None
        retry_for = self._retry_deadline_s if retry_for_s is None else retry_for_s
        retries = BACKOFF.until(time.monotonic() + retry_for)
        while True:
            try:
                status, retry_after, data = self._send(method, self._base + path, payload, wait_s)
            except ssl.SSLCertVerificationError as exc:
                raise RendezvousClientError(
                    f"the rendezvous service at {self._url} is not trusted: {exc}"
                ) from exc
            except (OSError, http.client.HTTPException) as exc:  # incl. an answer cut short
                pause = retries.next_pause()
                if pause is None:
                    raise RendezvousClientError(
                        f"rendezvous service at {self._host}:{self._port} unreachable for "
                        f"{retry_for:.0f} s: {exc}"
                    ) from exc
                logger.debug("rendezvous %s %s failed (%s); retrying", method, path, exc)
            else:
                if status < 300:
                    return data
                # a Retry-After: the operator takes its jobs back, or the job is busy
                asked = retry_after if status in (429, 503) else None
                retryable = status >= 500 or status == 429
                pause = retries.next_pause(instead=asked) if retryable else None
                if pause is None:
                    raise RendezvousClientError(
                        f"rendezvous {method} {path} refused with {status}: "
                        f"{data.decode(errors='replace')}"
                    )
                logger.info(
                    "rendezvous %s %s answered %d (%s); retrying in %.1f s (giving up %.0f s "
                    "from the first attempt)",
                    method,
                    path,
                    status,
                    data.decode(errors="replace")[:200],
                    pause,
                    retry_for,
                )
            time.sleep(pause)

    def _send(
        self, method: str, path: str, payload: bytes | None, wait_s: float
    ) -> tuple[int, float | None, bytes]:
        """The response's status, its ``Retry-After`` in seconds (if any) and its body, over
        the calling thread's connection."""
        connection: _Connection | None = getattr(self._local, "conn", None)
        if connection is None:
            connection = self._local.conn = _Connection(self._open())
        conn = connection.conn
        reused = conn.sock is not None
        if reused and _closed_by_peer(conn.sock):
            conn.close()
            reused = False
        try:
            return _exchange(conn, method, path, payload, self._headers, self._timeout(wait_s))
        except _CLOSED_BY_PEER as exc:
            conn.close()
            if not reused:
                raise
            logger.debug("the service closed a kept-alive connection (%r); reconnecting", exc)
        except BaseException:
            conn.close()
            raise
        try:
            return _exchange(conn, method, path, payload, self._headers, self._timeout(wait_s))
        except BaseException:
            conn.close()
            raise

    def _timeout(self, wait_s: float) -> float:
        return self._connect_timeout_s + wait_s

    def _open(self) -> http.client.HTTPConnection:
        """An HTTP connection object to the service (it connects on its first request)."""
        timeout = self._connect_timeout_s
        if self._tls is not None:
            return http.client.HTTPSConnection(
                self._host, self._port, timeout=timeout, context=self._tls
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)


_CLOSED_BY_PEER = (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)
"""What a request on a kept-alive connection that the service closed meanwhile fails with
(``http.client.RemoteDisconnected`` is a ``ConnectionResetError``)."""


class _Connection:
    """One thread's connection; closed when the thread (or the client) is gone."""

    def __init__(self, conn: http.client.HTTPConnection) -> None:
        self.conn = conn

    def __del__(self) -> None:
        self.conn.close()


def _exchange(
    conn: http.client.HTTPConnection,
    method: str,
    path: str,
    payload: bytes | None,
    headers: dict[str, str],
    timeout: float,
) -> tuple[int, float | None, bytes]:
    """One request and its whole response on ``conn`` (connected first if it is not)."""
    conn.timeout = timeout
    if conn.sock is not None:
        conn.sock.settimeout(timeout)
    conn.request(method, path, body=payload, headers=headers)
    response = conn.getresponse()
    return response.status, _seconds(response.getheader("Retry-After")), response.read()


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether an idle kept-alive connection has something to read: between requests the
    service sends nothing but the end of the connection."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def _seconds(retry_after: str | None) -> float | None:
    """A ``Retry-After`` header given in seconds (an HTTP date is not used by the service)."""
    try:
        return max(0.0, float(retry_after)) if retry_after is not None else None
    except ValueError:
        return None
