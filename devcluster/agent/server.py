"""HTTP endpoints of the agent.

- the kubelet endpoint (TLS, client certificates from the cluster CA) on each
  node address: ``/containerLogs/{ns}/{pod}/{container}`` serves ``kubectl logs``
  (follow, tailLines, limitBytes, previous), ``/healthz``;
- the control endpoint (Unix socket in the run directory) for faults and status.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from devcluster.agent.pod import PodWorker
from devcluster.config import ClusterConfig

logger = logging.getLogger(__name__)

FOLLOW_POLL = 0.2


class AgentApi(Protocol):
    """What the endpoints need from the agent."""

    def find_pod(self, namespace: str, name: str) -> PodWorker | None: ...

    def logs_dir(self, namespace: str, name: str) -> Path | None: ...

    async def fault_signal(
        self, namespace: str, pod: str, container: str | None, sig: str
    ) -> list[int]: ...

    async def fault_node(self, node: str, action: str, seconds: float | None) -> None: ...

    async def fault_evict(self, namespace: str, pod: str, reason: str) -> None: ...

    def status(self) -> dict[str, Any]: ...


def _tail(data: bytes, lines: int) -> bytes:
    if lines < 0:
        return data
    if lines == 0:
        return b""
    parts = data.splitlines(keepends=True)
    return b"".join(parts[-lines:])


def _log_file(logs: Path, container: str, previous: bool) -> Path | None:
    runs = sorted((int(p.stem), p) for p in (logs / container).glob("*.log") if p.stem.isdigit())
    if previous:
        runs = runs[:-1]
    return runs[-1][1] if runs else None


def kubelet_app(agent: AgentApi) -> web.Application:
    """The node (kubelet) API: logs and health."""

    async def container_logs(request: web.Request) -> web.StreamResponse:
        ns, name = request.match_info["namespace"], request.match_info["pod"]
        container = request.match_info["container"]
        q = request.query
        logs = agent.logs_dir(ns, name)
        path = _log_file(logs, container, q.get("previous") == "true") if logs else None
        if path is None:
            raise web.HTTPNotFound(text=f"no logs for container {container} of pod {ns}/{name}")
        data = path.read_bytes()
        data = _tail(data, int(q.get("tailLines", "-1")))
        limit = int(q["limitBytes"]) if "limitBytes" in q else None
        if limit is not None:
            data = data[:limit]
        follow = q.get("follow") == "true" and q.get("previous") != "true"
        if not follow:
            return web.Response(body=data, content_type="text/plain")
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        await resp.write(data)
        sent = len(data)
        offset = path.stat().st_size
        while limit is None or sent < limit:
            worker = agent.find_pod(ns, name)
            size = path.stat().st_size
            if size > offset:
                with open(path, "rb") as f:
                    f.seek(offset)
                    chunk = f.read(size - offset)
                offset = size
                if limit is not None:
                    chunk = chunk[: limit - sent]
                await resp.write(chunk)
                sent += len(chunk)
                continue
            running = worker is not None and any(
                "running" in c.state and path == worker.log_path(c.name, c.restart_count)
                for c in worker.containers(container)
            )
            if not running:
                break
            await asyncio.sleep(FOLLOW_POLL)
        await resp.write_eof()
        return resp

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def unsupported(request: web.Request) -> web.Response:
        return web.Response(
            status=501,
            text="devcluster runs pods as plain processes and does not support "
            f"{request.path.split('/')[1]}; use `python -m devcluster logs` or the pod's files",
        )

    app = web.Application()
    app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", container_logs)
    app.router.add_get("/healthz", healthz)
    for verb in ("exec", "attach", "portForward", "run"):
        app.router.add_route("*", f"/{verb}/{{tail:.*}}", unsupported)
    return app


def kubelet_ssl(cfg: ClusterConfig) -> ssl.SSLContext:
    """Serving TLS that requires a client certificate signed by the cluster CA."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(cfg.pki_dir / "ca.crt"))
    ctx.load_cert_chain(cfg.pki_dir / "kubelet.crt", cfg.pki_dir / "kubelet.key")
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json_handler(fn: Callable[[dict[str, Any]], Awaitable[Any]]) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json() if request.can_read_body else {}
            result = await fn(body)
        except (KeyError, LookupError, ValueError) as err:
            return web.json_response({"error": str(err)}, status=400)
        return web.json_response(result if result is not None else {})

    return handle


def control_app(agent: AgentApi) -> web.Application:
    """Fault injection and status, for the CLI and tests."""

    async def sig(body: dict[str, Any]) -> dict[str, Any]:
        pids = await agent.fault_signal(
            body.get("namespace") or "default", body["pod"], body.get("container"), body["signal"]
        )
        return {"pids": pids}

    async def node(body: dict[str, Any]) -> None:
        await agent.fault_node(body["node"], body["action"], body.get("for"))

    async def evict(body: dict[str, Any]) -> None:
        await agent.fault_evict(
            body.get("namespace") or "default",
            body["pod"],
            body.get("reason") or "PreemptionByScheduler",
        )

    async def status(body: dict[str, Any]) -> dict[str, Any]:
        return agent.status()

    app = web.Application()
    app.router.add_post("/faults/signal", _json_handler(sig))
    app.router.add_post("/faults/node", _json_handler(node))
    app.router.add_post("/faults/evict", _json_handler(evict))
    app.router.add_get("/status", _json_handler(status))
    return app
