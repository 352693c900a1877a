"""Per-pod hosts files that make Service names resolve to ready endpoints.

Each pod gets ``<pod dir>/hosts``, bind-mounted over ``/etc/hosts`` inside its
mount namespace. For every Service with ready endpoints it lists, for each
ready address::

    <pod ip>  <svc>.<ns>.svc.cluster.local <svc>.<ns>.svc <svc>.<ns> [<svc> in the same ns]
    <pod ip>  <hostname>.<svc>.<ns>.svc.cluster.local ...   (headless, per-pod records)

The files are rewritten in place (the bind mount pins the inode) whenever
Endpoints change. Names resolve to pod IPs, so a client must connect to the
target port: Services whose port equals their targetPort work unchanged.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from devcluster.agent.kubeapi import Obj

logger = logging.getLogger(__name__)

DOMAIN = "cluster.local"


class HostsFiles:
    """Keeps every local pod's hosts file current."""

    def __init__(self) -> None:
        #: (namespace, service) -> list of (ip, hostname or "")
        self._endpoints: dict[tuple[str, str], list[tuple[str, str]]] = {}
        #: pod uid -> (path, namespace, own lines)
        self._pods: dict[str, tuple[Path, str, str]] = {}
        self._written: dict[str, str] = {}
        self._pending: asyncio.Task[None] | None = None

    async def on_endpoints(self, kind: str, obj: Obj) -> None:
        """Informer handler for Endpoints."""
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        if kind == "DELETED":
            changed = self._endpoints.pop(key, None) is not None
        else:
            ready: list[tuple[str, str]] = []
            for subset in obj.get("subsets") or []:
                for addr in subset.get("addresses") or []:
                    ready.append((addr["ip"], addr.get("hostname", "")))
            ready.sort()
            changed = self._endpoints.get(key) != ready
            self._endpoints[key] = ready
        if changed:
            self._schedule()

    def _schedule(self) -> None:
        if self._pending is None or self._pending.done():
            self._pending = asyncio.get_running_loop().create_task(self._rewrite_soon())

    async def _rewrite_soon(self) -> None:
        await asyncio.sleep(0.05)
        for uid in list(self._pods):
            self._write(uid)

    def add_pod(
        self, uid: str, path: Path, namespace: str, hostname: str, fqdn: str, ip: str
    ) -> None:
        """Create the hosts file of a new pod."""
        names = " ".join(dict.fromkeys(n for n in (fqdn, hostname) if n))
        own = f"{ip}\t{names}\n"
        path.parent.mkdir(parents=True, exist_ok=True)
        self._pods[uid] = (path, namespace, own)
        self._write(uid)

    def remove_pod(self, uid: str) -> None:
        """Forget a pod."""
        self._pods.pop(uid, None)
        self._written.pop(uid, None)

    def render(self, namespace: str, own: str) -> str:
        """Content of a hosts file for a pod in ``namespace``."""
        lines = [
            "# Kubernetes-managed hosts file (devcluster).",
            "127.0.0.1\tlocalhost",
            "::1\tlocalhost ip6-localhost ip6-loopback",
            own.rstrip("\n"),
        ]
        for (ns, svc), addresses in sorted(self._endpoints.items()):
            base = f"{svc}.{ns}"
            names = [f"{base}.svc.{DOMAIN}", f"{base}.svc", base]
            if ns == namespace:
                names.append(svc)
            for ip, hostname in addresses:
                lines.append(f"{ip}\t{' '.join(names)}")
                if hostname:
                    lines.append(f"{ip}\t{hostname}.{base}.svc.{DOMAIN} {hostname}.{base}.svc")
        return "\n".join(lines) + "\n"

    def _write(self, uid: str) -> None:
        path, namespace, own = self._pods[uid]
        content = self.render(namespace, own)
        if self._written.get(uid) == content:
            return
        try:
            # In place: the pod's bind mount refers to this inode.
            if not path.exists():
                path.write_text(content)
            else:
                with open(path, "r+") as f:
                    f.write(content)
                    f.truncate()
        except OSError as err:
            logger.warning("cannot write %s: %s", path, err)
            return
        self._written[uid] = content
