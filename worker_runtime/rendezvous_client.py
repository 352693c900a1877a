"""A small synchronous client of the rendezvous service, for worker processes.

It uses only the standard library (the worker image carries no aiohttp), sends the job's
bearer token on every request and retries connection errors and 5xx answers with bounded
exponential backoff (a 503's ``Retry-After`` is honoured: the service answers it for a job it
is still taking back after a restart), so a restarting operator does not kill training.
"""

from __future__ import annotations

import http.client
import logging
import ssl
import time
import urllib.parse

from pydantic import BaseModel

from elasticjob.wire import (
    API_PREFIX,
    HeartbeatRequest,
    NoticesResponse,
    ProgressRequest,
    RendezvousRequest,
    RendezvousResponse,
    ResultRequest,
    RoundInfo,
)

logger = logging.getLogger(__name__)


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
        retry_deadline_s: float = 120.0,
        connect_timeout_s: float = 5.0,
        ca_pem: str | None = None,
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"rendezvous URL must look like http(s)://host:port, got {url!r}")
        self._ssl = ssl.create_default_context(cadata=ca_pem) if parsed.scheme == "https" else None
        self._host = parsed.hostname
        self._port = parsed.port or (443 if self._ssl else 80)
        self._base = f"{API_PREFIX}/jobs/{urllib.parse.quote(job, safe='')}"
        self._headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self._retry_deadline_s = retry_deadline_s
        self._connect_timeout_s = connect_timeout_s

    def rendezvous(self, request: RendezvousRequest) -> RendezvousResponse:
        """Long-poll for the worker's next round (see ``RendezvousRequest``)."""
        data = self._request("POST", "/rendezvous", request, wait_s=request.wait_seconds)
        return RendezvousResponse.model_validate_json(data)

    def notices(self, after_seq: int, wait_seconds: float) -> NoticesResponse:
        """Long-poll for notices newer than ``after_seq``."""
        path = f"/notices?after={after_seq}&wait={wait_seconds}"
        return NoticesResponse.model_validate_json(
            self._request("GET", path, None, wait_s=wait_seconds)
        )

    def report_result(self, request: ResultRequest) -> None:
        self._request("POST", "/results", request)

    def report_progress(self, request: ProgressRequest) -> None:
        self._request("POST", "/progress", request)

    def heartbeat(self, request: HeartbeatRequest) -> None:
        """Send one heartbeat, without retrying: the next beat is the retry. Raises
        :class:`RendezvousClientError` if it did not arrive."""
        payload = request.model_dump_json().encode()
        try:
            status, _retry_after, data = self._send("POST", self._base + "/heartbeat", payload, 0.0)
        except OSError as exc:
            raise RendezvousClientError(f"heartbeat not sent: {exc}") from exc
        if status >= 300:
            raise RendezvousClientError(
                f"heartbeat refused with {status}: {data.decode(errors='replace')}"
            )

    def round_info(self) -> RoundInfo:
        return RoundInfo.model_validate_json(self._request("GET", "/round", None))

    def _request(
        self, method: str, path: str, body: BaseModel | None, *, wait_s: float = 0.0
    ) -> bytes:
        payload = body.model_dump_json().encode() if body is not None else None
        deadline = time.monotonic() + self._retry_deadline_s
        delay = 0.05
        while True:
            pause = delay
            try:
                status, retry_after, data = self._send(method, self._base + path, payload, wait_s)
            except OSError as exc:
                if time.monotonic() + delay > deadline:
                    raise RendezvousClientError(
                        f"rendezvous service at {self._host}:{self._port} unreachable for "
                        f"{self._retry_deadline_s:.0f} s: {exc}"
                    ) from exc
                logger.debug("rendezvous %s %s failed (%s); retrying", method, path, exc)
            else:
                if status < 300:
                    return data
                if status == 503 and retry_after is not None:
                    pause = retry_after  # e.g. the operator restarted and takes its jobs back
                if status < 500 or time.monotonic() + pause > deadline:
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
                    self._retry_deadline_s,
                )
            time.sleep(pause)
            delay = min(delay * 2, 2.0)

    def _send(
        self, method: str, path: str, payload: bytes | None, wait_s: float
    ) -> tuple[int, float | None, bytes]:
        """The response's status, its ``Retry-After`` in seconds (if any) and its body."""
        timeout = self._connect_timeout_s + wait_s
        conn = (
            http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._ssl)
            if self._ssl
            else http.client.HTTPConnection(self._host, self._port, timeout=timeout)
        )
        try:
            conn.request(method, path, body=payload, headers=self._headers)
            response = conn.getresponse()
            return response.status, _seconds(response.getheader("Retry-After")), response.read()
        finally:
            conn.close()


def _seconds(retry_after: str | None) -> float | None:
    """A ``Retry-After`` header given in seconds (an HTTP date is not used by the service)."""
    try:
        return max(0.0, float(retry_after)) if retry_after is not None else None
    except ValueError:
        return None
