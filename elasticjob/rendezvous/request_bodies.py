"""Reading what a worker sends the rendezvous service: its body, within its bounds (size,
time, the job's bodies in flight), parsed by the strict wire model; and the JSON answers,
errors included (:class:`ApiError`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Final, TypeVar

from aiohttp import ClientPayloadError, http_exceptions, web
from pydantic import BaseModel, ValidationError

from elasticjob.rendezvous.limits import InFlight
from elasticjob.wire.messages import ErrorResponse
from elasticjob.wire.strict_json import DuplicateKeyError, parse_json

MAX_BODY_BYTES: Final = 64 * 1024
"""Largest request body accepted; larger ones get 413. The largest valid body, a result with
a 4,096-character message of 4-byte characters, is about 16 KiB."""

BODY_TIMEOUT_S: Final = 10.0
"""Seconds a request's body may take to arrive once its headers did (the service's default):
the largest valid body takes milliseconds on a working link, and one held open would hold a
handler."""

_Model = TypeVar("_Model", bound=BaseModel)


class ApiError(Exception):
    """An error answered to the client as a JSON
    :class:`~elasticjob.wire.messages.ErrorResponse`."""

    def __init__(
        self,
        status: int,
        error: str,
        detail: list[dict[str, object]] | str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(error)
        self.status = status
        self.error = error
        self.detail = detail
        self.headers = dict(headers or {})

    def response(self) -> web.Response:
        """The JSON response that carries this error."""
        body = ErrorResponse(error=self.error, detail=self.detail)
        return json_response(body, status=self.status, headers=self.headers)


def json_response(
    model: BaseModel,
    *,
    status: int = 200,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    return web.Response(
        body=model.model_dump_json().encode(),
        status=status,
        headers=headers,
        content_type="application/json",
    )


def _where(err: Mapping[str, object], what: str) -> str:
    loc = err.get("loc")
    parts = [str(part) for part in loc] if isinstance(loc, list) else []
    return ".".join(parts) or what


def invalid(what: str, exc: ValidationError) -> ApiError:
    detail: list[dict[str, object]] = json.loads(exc.json(include_url=False, include_input=False))
    fields = "; ".join(f"{_where(err, what)}: {err.get('msg')}" for err in detail[:5])
    status = 400 if any(err.get("type") == "json_invalid" for err in detail) else 422
    return ApiError(status, f"invalid {what}: {fields}", detail)


async def _read_body(request: web.Request, bodies: InFlight, timeout: float) -> bytes:
    """The request's body, read within ``timeout`` seconds (408) as one of ``bodies``, the
    job's bodies in flight; a client that goes away before sending all of it (a worker
    process that exits with a report in flight) is a 400, not a failure of the service."""
    try:
        with bodies.hold():
            async with asyncio.timeout(timeout):
                return await _read_whole_body(request)
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout:g} s") from None
    except (ConnectionError, ClientPayloadError, http_exceptions.HttpProcessingError) as exc:
        raise ApiError(400, f"the request body ended early: {exc}") from None


async def _read_whole_body(request: web.Request) -> bytes:
    too_large = ApiError(413, f"request body is larger than {MAX_BODY_BYTES} bytes")
    if request.content_length is not None:
        if request.content_length > MAX_BODY_BYTES:
            raise too_large
        return await request.read()  # the parser stops at Content-Length
    body = bytearray()
    while chunk := await request.content.readany():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise too_large
    return bytes(body)


async def parse_body(
    request: web.Request, bodies: InFlight, model: type[_Model], timeout: float
) -> _Model:
    """The request's body as ``model``, read within ``timeout`` seconds of its headers (see
    :func:`_read_body`); every failure an :class:`ApiError`."""
    body = await _read_body(request, bodies, timeout)
    try:
        return parse_json(model, body)
    except ValidationError as exc:
        raise invalid("request body", exc) from exc
    except DuplicateKeyError as exc:
        raise ApiError(400, f"invalid request body: {exc}") from exc
