"""How the rendezvous service meets its connections: TLS when given a context, a deadline for
a request's headers, and bad HTTP logged as one line.

Connections are kept alive between requests (a worker's heartbeats reuse one), and no
connection waits longer than the header timeout (:data:`HEADER_TIMEOUT_S`) for a request's
headers: :class:`GuardedSite` closes a new connection whose first request's headers have not
ended that long after it opened (after the TLS handshake, which has the same bound of its
own), and the service's keep-alive timeout, the same number of seconds, closes a connection
whose next request has not been received whole that long after the previous answer (aiohttp
counts a request whose headers are still arriving as idle time). A refused request's answer
closes its connection (``routes.py``).
"""

from __future__ import annotations

import asyncio
import logging
import re
import resource
import ssl
from dataclasses import dataclass
from typing import Final

from aiohttp import http_exceptions, web

logger = logging.getLogger(__name__)

HEADER_TIMEOUT_S: Final = 5.0
"""Seconds a connection may take to send the request line and headers."""

LISTEN_BACKLOG: Final = 4096
"""Connections the kernel queues before the service accepts them (it caps this at
``net.core.somaxconn``). Every worker of a job opens a connection at the same moment when a
notice wakes their long-polls: with aiohttp's default of 128, a 1,024-worker job overflowed
the queue and the dropped SYNs were retried by the clients' kernels only 1 s and 3 s later."""

_HEADERS_END: Final = b"\r\n\r\n"
_BEARER: Final = re.compile(r"(?i)bearer\s+\S+")


def _one_line(text: str, limit: int = 200) -> str:
    """``text`` on one line, at most ``limit`` characters, with any bearer token masked."""
    return _BEARER.sub("Bearer <redacted>", " ".join(text.split()))[:limit]


class _OneLineBadHttp(logging.Filter):
    """Turns aiohttp's ERROR-with-traceback for malformed HTTP into a one-line WARNING."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, http_exceptions.HttpProcessingError):
            remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.msg = "bad HTTP request from %s: %s: %s"
            record.args = (remote, type(exc).__name__, _one_line(exc.message))
            record.exc_info = None
            record.exc_text = None
            record.levelno = logging.WARNING
            record.levelname = logging.getLevelName(logging.WARNING)
        return True


def protocol_logger() -> logging.Logger:
    """The logger the service's HTTP protocol reports connection-level errors to."""
    protocol = logging.getLogger(f"{__name__}.http")
    if not any(isinstance(f, _OneLineBadHttp) for f in protocol.filters):
        protocol.addFilter(_OneLineBadHttp())
    return protocol


@dataclass
class ConnectionCounts:
    """The connections a site has accepted since it started, and those open now."""

    accepted: int = 0
    open: int = 0


class _HeaderDeadline(asyncio.Protocol):
    """Passes everything to aiohttp's protocol; closes the connection if the end of the first
    request's headers does not arrive in time."""

    def __init__(self, inner: asyncio.Protocol, timeout: float, counts: ConnectionCounts) -> None:
        self._inner = inner
        self._timeout = timeout
        self._counts = counts
        self._timer: asyncio.TimerHandle | None = None
        self._tail = b""
        self._transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._counts.accepted += 1
        self._counts.open += 1
        self._transport = transport
        self._timer = asyncio.get_running_loop().call_later(self._timeout, self._expire)
        self._inner.connection_made(transport)

    def _expire(self) -> None:
        self._timer = None
        if self._transport is not None and not self._transport.is_closing():
            peer = self._transport.get_extra_info("peername")
            logger.warning(
                "closing a connection from %s: no complete request headers within %.0f s",
                peer,
                self._timeout,
            )
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        if self._timer is not None:
            seen = self._tail + data
            if _HEADERS_END in seen:
                self._timer.cancel()
                self._timer = None
            self._tail = seen[-(len(_HEADERS_END) - 1) :]
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._counts.open -= 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


class GuardedSite(web.TCPSite):
    """A TCP site (TLS when given ``ssl_context``) whose connections must send their request
    headers within ``header_timeout`` seconds, with a listen queue of
    :data:`LISTEN_BACKLOG`; it counts its connections in :attr:`connections`."""

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        header_timeout: float = HEADER_TIMEOUT_S,
    ) -> None:
        super().__init__(runner, host, port, ssl_context=ssl_context, backlog=LISTEN_BACKLOG)
        self._header_timeout = header_timeout
        self.connections = ConnectionCounts()

    async def start(self) -> None:
        """Listen (registering with the runner as every site does)."""
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        timeout, counts = self._header_timeout, self.connections
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _HeaderDeadline(server(), timeout, counts),
            self._host,
            self._port,
            ssl=self._ssl_context,
            ssl_handshake_timeout=timeout if self._ssl_context else None,
            backlog=self._backlog,
        )


def raise_open_files_limit() -> int:
    """Raise this process's limit of open files to its hard limit (capped at 2**20), since a
    serving process holds about three connections per worker (its notices long-poll, its
    heartbeat's and its training thread's kept-alive connections) and container runtimes may
    start it with a soft limit of 1,024. Returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(2**20 if hard == resource.RLIM_INFINITY else hard, 2**20)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (OSError, ValueError) as exc:
        logger.warning("could not raise the open-files limit from %d to %d: %s", soft, wanted, exc)
        return soft
    return wanted
