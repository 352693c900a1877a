"""Readiness and liveness probes: exec (inside the pod's namespaces), httpGet, tcpSocket."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp

from devcluster.agent.kubeapi import Obj

logger = logging.getLogger(__name__)


def _port(value: int | str, container: Obj) -> int:
    if isinstance(value, int) or str(value).isdigit():
        return int(value)
    for port in container.get("ports") or []:
        if port.get("name") == value:
            return int(port["containerPort"])
    raise ValueError(f"unknown named port {value!r}")


async def probe_once(
    probe: Obj, container: Obj, pod_ip: str, pid: int, env: dict[str, str]
) -> tuple[bool, str]:
    """Run one probe; return (success, message)."""
    timeout = float(probe.get("timeoutSeconds", 1))
    try:
        if "exec" in probe:
            argv = ["nsenter", "-t", str(pid), "-m", "-u", "--", *probe["exec"]["command"]]
            proc = await asyncio.create_subprocess_exec(
                *argv,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                out, _ = await asyncio.wait_for(proc.communicate(), timeout)
            except TimeoutError:
                proc.kill()
                await proc.wait()
                return False, f"command timed out after {timeout:g}s"
            return proc.returncode == 0, out.decode(errors="replace")[-200:]
        if "httpGet" in probe:
            get = probe["httpGet"]
            host = get.get("host") or pod_ip
            scheme = str(get.get("scheme", "HTTP")).lower()
            url = f"{scheme}://{host}:{_port(get['port'], container)}{get.get('path', '/')}"
            headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
                session.get(url, headers=headers, ssl=False) as resp,
            ):
                return 200 <= resp.status < 400, f"HTTP probe failed with statuscode: {resp.status}"
        if "tcpSocket" in probe:
            sock = probe["tcpSocket"]
            host = sock.get("host") or pod_ip
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(host, _port(sock["port"], container)), timeout
            )
            writer.close()
            return True, ""
    except (TimeoutError, OSError, aiohttp.ClientError, ValueError) as err:
        return False, f"probe failed: {err!r}"
    return False, "unsupported probe handler"


async def probe_loop(
    probe: Obj,
    container: Obj,
    pod_ip: str,
    pid: int,
    env: dict[str, str],
    on_change: Callable[[bool, str], None],
    initial: bool,
) -> None:
    """Probe periodically; call ``on_change(state, message)`` when the verdict flips."""
    period = float(probe.get("periodSeconds", 10))
    success_needed = int(probe.get("successThreshold", 1))
    failure_needed = int(probe.get("failureThreshold", 3))
    state = initial
    successes = failures = 0
    await asyncio.sleep(float(probe.get("initialDelaySeconds", 0)))
    while True:
        ok, message = await probe_once(probe, container, pod_ip, pid, env)
        if ok:
            successes, failures = successes + 1, 0
            if not state and successes >= success_needed:
                state = True
                on_change(True, message)
        else:
            successes, failures = 0, failures + 1
            if state and failures >= failure_needed:
                state = False
                on_change(False, message)
            elif not state and failures == 1:
                logger.debug("probe of %s failed: %s", container.get("name"), message)
        await asyncio.sleep(period)
