"""A small asyncio client of the Kubernetes REST API, with list+watch informers."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp

logger = logging.getLogger(__name__)

Obj = dict[str, Any]


class ApiError(Exception):
    """A non-2xx answer from the API server."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status
        self.body = body


class Api:
    """Authenticated HTTPS client of one API server."""

    def __init__(self, server: str, token: str, ca_file: str) -> None:
        self._server = server
        self._headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self._ssl = ssl.create_default_context(cafile=ca_file)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The shared client session (created on first use)."""
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._ssl, limit=32)
            self._session = aiohttp.ClientSession(connector=connector, headers=self._headers)
        return self._session

    async def close(self) -> None:
        """Close the session."""
        if self._session is not None:
            await self._session.close()

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, str] | None = None,
        content_type: str = "application/json",
        timeout: float = 30.0,
    ) -> Obj:
        """Send a request; return the decoded JSON answer or raise ApiError."""
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        async with self.session.request(
            method,
            self._server + path,
            data=data,
            params=params,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as resp:
            text = await resp.text()
            if resp.status >= 300:
                raise ApiError(resp.status, text)
            result: Obj = json.loads(text) if text else {}
            return result

    async def get(self, path: str, params: dict[str, str] | None = None) -> Obj:
        """GET."""
        return await self.request("GET", path, params=params)

    async def post(self, path: str, body: Obj) -> Obj:
        """POST (create)."""
        return await self.request("POST", path, body)

    async def merge_patch(self, path: str, body: Obj) -> Obj:
        """PATCH with a JSON merge patch."""
        return await self.request("PATCH", path, body, content_type="application/merge-patch+json")

    async def delete(self, path: str, body: Obj | None = None) -> Obj:
        """DELETE."""
        return await self.request("DELETE", path, body)

    async def watch(self, path: str, resource_version: str) -> AsyncIterator[Obj]:
        """Yield watch events from ``resource_version`` until the server closes the stream."""
        params = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": "600",
        }
        async with self.session.get(
            self._server + path,
            params=params,
            timeout=aiohttp.ClientTimeout(total=None, sock_read=700),
        ) as resp:
            if resp.status >= 300:
                raise ApiError(resp.status, await resp.text())
            buf = b""
            async for chunk in resp.content.iter_any():
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)


Handler = Callable[[str, Obj], Awaitable[None]]


class Informer:
    """List then watch a collection, calling ``handler(type, obj)`` for each change.

    After a re-list the handler sees ``ADDED`` for every current object and
    ``DELETED`` for those that vanished meanwhile.
    """

    def __init__(self, api: Api, path: str, handler: Handler) -> None:
        self._api = api
        self._path = path
        self._handler = handler
        self._known: dict[str, Obj] = {}
        self.synced = asyncio.Event()

    async def _handle(self, kind: str, obj: Obj) -> None:
        try:
            await self._handler(kind, obj)
        except Exception:
            logger.exception("handler of %s failed on %s %s", self._path, kind, self.key(obj))

    @staticmethod
    def key(obj: Obj) -> str:
        """namespace/name of an object."""
        meta = obj.get("metadata", {})
        return f"{meta.get('namespace', '')}/{meta.get('name', '')}"

    async def _relist(self) -> str:
        listing = await self._api.get(self._path)
        seen: dict[str, Obj] = {}
        for item in listing.get("items", []):
            seen[self.key(item)] = item
        for key, old in list(self._known.items()):
            if key not in seen:
                del self._known[key]
                await self._handle("DELETED", old)
        for key, item in seen.items():
            self._known[key] = item
            await self._handle("ADDED", item)
        self.synced.set()
        version: str = listing["metadata"]["resourceVersion"]
        return version

    async def run(self) -> None:
        """Run forever (until cancelled)."""
        version: str | None = None
        while True:
            try:
                if version is None:
                    version = await self._relist()
                async for event in self._api.watch(self._path, version):
                    kind = event.get("type")
                    obj = event.get("object", {})
                    if kind == "ERROR":
                        logger.debug("watch %s: %s; re-listing", self._path, obj.get("message"))
                        version = None
                        break
                    version = obj.get("metadata", {}).get("resourceVersion", version)
                    if kind == "BOOKMARK":
                        continue
                    key = self.key(obj)
                    if kind == "DELETED":
                        self._known.pop(key, None)
                    else:
                        self._known[key] = obj
                    await self._handle(str(kind), obj)
            except asyncio.CancelledError:
                raise
            except ApiError as err:
                logger.warning("watch %s failed: %s", self._path, err)
                version = None
                await asyncio.sleep(1.0)
            except (TimeoutError, aiohttp.ClientError, ValueError) as err:
                logger.warning("watch %s interrupted: %r", self._path, err)
                await asyncio.sleep(0.5)
