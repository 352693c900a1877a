"""A container's environment, as a kubelet computes it.

Order: image defaults, the ``KUBERNETES_SERVICE_*`` variables, ``envFrom``,
then ``env`` (literal values with ``$(VAR)`` expansion, and ``valueFrom``:
``fieldRef``, ``resourceFieldRef``, ``secretKeyRef``, ``configMapKeyRef``).
"""

from __future__ import annotations

import base64
import logging
import math
import re
from typing import Any

from devcluster.agent.kubeapi import Api, ApiError, Obj

logger = logging.getLogger(__name__)

_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)|\$\$")
_SUFFIX = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
}  # fmt: skip


class ConfigError(Exception):
    """A referenced Secret/ConfigMap/key is missing (CreateContainerConfigError)."""


def parse_quantity(text: str) -> float:
    """``"500m"`` -> 0.5, ``"1Gi"`` -> 1073741824.0."""
    text = str(text).strip()
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * _SUFFIX[suffix]
    return float(text)


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion; unknown references stay as written."""

    def repl(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env.get(name, m.group(0))

    return _REF.sub(repl, value)


def field_value(pod: Obj, path: str) -> str:
    """Value of a downward-API ``fieldPath`` for ``pod``."""
    meta, spec, status = pod["metadata"], pod.get("spec", {}), pod.get("status", {})
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    simple: dict[str, Any] = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
    }
    if path in simple:
        return str(simple[path] or "")
    if path == "status.podIPs":
        return ",".join(p["ip"] for p in status.get("podIPs") or [])
    if path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    raise ConfigError(f"unsupported fieldPath {path!r}")


def resource_value(container: Obj, ref: Obj) -> str:
    """Value of a ``resourceFieldRef`` (limits fall back to the node's capacity: 0)."""
    kind, _, name = ref["resource"].partition(".")
    resources = container.get("resources") or {}
    value = (resources.get(kind) or {}).get(name)
    if value is None and kind == "limits":
        value = (resources.get("requests") or {}).get(name)
    if value is None:
        return "0"
    divisor = parse_quantity(ref.get("divisor") or "1")
    return str(math.ceil(parse_quantity(value) / divisor))


class Lookup:
    """Fetches Secrets and ConfigMaps of one namespace, each at most once."""

    def __init__(self, api: Api, namespace: str) -> None:
        self._api = api
        self._ns = namespace
        self._cache: dict[tuple[str, str], Obj | None] = {}

    async def get(self, kind: str, name: str) -> Obj | None:
        """The object, or None if it does not exist."""
        key = (kind, name)
        if key not in self._cache:
            try:
                self._cache[key] = await self._api.get(
                    f"/api/v1/namespaces/{self._ns}/{kind}/{name}"
                )
            except ApiError as err:
                if err.status != 404:
                    raise
                self._cache[key] = None
        return self._cache[key]

    async def data(self, kind: str, name: str, optional: bool) -> dict[str, bytes] | None:
        """Decoded data of a secret or configmap; None if optional and missing."""
        obj = await self.get(kind, name)
        if obj is None:
            if optional:
                return None
            singular = "secret" if kind == "secrets" else "configmap"
            raise ConfigError(f'{singular} "{name}" not found')
        if kind == "secrets":
            return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        out = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
        out.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
        return out


async def _key_ref(lookup: Lookup, kind: str, ref: Obj) -> str | None:
    data = await lookup.data(kind, ref["name"], bool(ref.get("optional")))
    if data is None:
        return None
    if ref["key"] not in data:
        if ref.get("optional"):
            return None
        raise ConfigError(f"couldn't find key {ref['key']} in {kind[:-1]} {ref['name']}")
    return data[ref["key"]].decode(errors="replace")


async def container_env(
    pod: Obj, container: Obj, base: dict[str, str], lookup: Lookup
) -> dict[str, str]:
    """The full environment of ``container``; raises ConfigError."""
    env = dict(base)
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for key_, kind in (("configMapRef", "configmaps"), ("secretRef", "secrets")):
            if key_ in source:
                ref = source[key_]
                data = await lookup.data(kind, ref["name"], bool(ref.get("optional")))
                for k, v in (data or {}).items():
                    env[prefix + k] = v.decode(errors="replace")
    for var in container.get("env") or []:
        name = var["name"]
        if "valueFrom" not in var:
            env[name] = expand(var.get("value", ""), env)
            continue
        source = var["valueFrom"]
        value: str | None
        if "fieldRef" in source:
            value = field_value(pod, source["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in source:
            value = resource_value(container, source["resourceFieldRef"])
        elif "secretKeyRef" in source:
            value = await _key_ref(lookup, "secrets", source["secretKeyRef"])
        elif "configMapKeyRef" in source:
            value = await _key_ref(lookup, "configmaps", source["configMapKeyRef"])
        else:
            raise ConfigError(f"unsupported valueFrom in env {name}")
        if value is not None:
            env[name] = value
    return env


def command_line(
    container: Obj, default_command: tuple[str, ...], env: dict[str, str]
) -> list[str]:
    """``command`` + ``args`` with ``$(VAR)`` expansion.

    Images behave as if they had no ENTRYPOINT and ``default_command`` as CMD:
    ``args`` alone replace the default command.
    """
    command = container.get("command")
    args = container.get("args") or []
    argv = [*command, *args] if command else (args or list(default_command))
    if not argv:
        raise ConfigError("no command specified")
    return [expand(a, env) for a in argv]
