"""A pod's volumes, materialised as directories under the pod's directory.

Supported: emptyDir, secret, configMap, downwardAPI, projected (with
serviceAccountToken from the TokenRequest API, configMap, secret,
downwardAPI), hostPath, and persistentVolumeClaim (a directory per claim kept
for the cluster's lifetime). The runner bind-mounts them at their mountPaths
in the pod's own mount namespace.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

from devcluster.agent.env import ConfigError, Lookup, field_value, resource_value
from devcluster.agent.kubeapi import Api, Obj

logger = logging.getLogger(__name__)


def _write(path: Path, data: bytes, mode: int | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode if mode is not None else 0o644)
    tmp.replace(path)


def _project(
    target: Path, data: dict[str, bytes], items: list[Obj] | None, mode: int | None
) -> None:
    if items:
        for item in items:
            if item["key"] not in data:
                raise ConfigError(f"key {item['key']} not found")
            _write(target / item["path"], data[item["key"]], item.get("mode", mode))
    else:
        for key, value in data.items():
            _write(target / key, value, mode)


def claim_dir(run_dir: Path, namespace: str, claim: str) -> Path:
    """The folder of a PersistentVolumeClaim: what its pods mount, on every node, for the
    cluster's lifetime (the volume provisioner's hostPath volume for it points here)."""
    return run_dir / "volumes" / namespace / claim


class Volumes:
    """Creates the volume directories of one pod."""

    def __init__(self, api: Api, pod: Obj, pod_dir: Path, run_dir: Path) -> None:
        self._api = api
        self._pod = pod
        self._root = pod_dir / "volumes"
        self._run_dir = run_dir
        self._lookup = Lookup(api, pod["metadata"]["namespace"])
        #: (path, audience, expirationSeconds) of projected tokens, for refreshing.
        self.tokens: list[tuple[Path, str | None, int]] = []

    async def materialise(self) -> dict[str, Path]:
        """Create every volume; return name -> host path. Raises ConfigError."""
        paths: dict[str, Path] = {}
        self._root.mkdir(parents=True, exist_ok=True)
        for vol in self._pod["spec"].get("volumes") or []:
            paths[vol["name"]] = await self._one(vol)
        return paths

    async def _one(self, vol: Obj) -> Path:
        name = str(vol["name"])
        target: Path = self._root / name
        if "hostPath" in vol:
            path = Path(str(vol["hostPath"]["path"]))
            if vol["hostPath"].get("type") in ("DirectoryOrCreate", None, ""):
                path.mkdir(parents=True, exist_ok=True)
            return path
        if "persistentVolumeClaim" in vol:
            ns = self._pod["metadata"]["namespace"]
            claim = str(vol["persistentVolumeClaim"]["claimName"])
            path = claim_dir(self._run_dir, str(ns), claim)
            path.mkdir(parents=True, exist_ok=True)
            return path
        target.mkdir(parents=True, exist_ok=True)
        if "emptyDir" in vol:
            return target
        if "secret" in vol:
            src = vol["secret"]
            data = await self._lookup.data("secrets", src["secretName"], bool(src.get("optional")))
            _project(target, data or {}, src.get("items"), src.get("defaultMode"))
        elif "configMap" in vol:
            src = vol["configMap"]
            data = await self._lookup.data("configmaps", src["name"], bool(src.get("optional")))
            _project(target, data or {}, src.get("items"), src.get("defaultMode"))
        elif "downwardAPI" in vol:
            src = vol["downwardAPI"]
            self._downward(target, src.get("items") or [], src.get("defaultMode"))
        elif "projected" in vol:
            await self._projected(target, vol["projected"])
        else:
            kinds = [k for k in vol if k != "name"]
            raise ConfigError(f"volume {name}: unsupported volume type {kinds}")
        return target

    def _downward(self, target: Path, items: list[Obj], mode: int | None) -> None:
        containers = {c["name"]: c for c in self._pod["spec"].get("containers", [])}
        for item in items:
            if "fieldRef" in item:
                value = field_value(self._pod, item["fieldRef"]["fieldPath"])
            else:
                ref = item["resourceFieldRef"]
                container = containers.get(ref.get("containerName", ""), {})
                value = resource_value(container, ref)
            _write(target / item["path"], value.encode(), item.get("mode", mode))

    async def _projected(self, target: Path, spec: Obj) -> None:
        mode = spec.get("defaultMode")
        for source in spec.get("sources") or []:
            if "serviceAccountToken" in source:
                tok = source["serviceAccountToken"]
                path = target / tok["path"]
                expiry = int(tok.get("expirationSeconds", 3607))
                self.tokens.append((path, tok.get("audience"), expiry))
                await self.write_token(path, tok.get("audience"), expiry, mode)
            elif "secret" in source or "configMap" in source:
                kind = "secrets" if "secret" in source else "configmaps"
                src = source["secret" if kind == "secrets" else "configMap"]
                data = await self._lookup.data(kind, src["name"], bool(src.get("optional")))
                _project(target, data or {}, src.get("items"), mode)
            elif "downwardAPI" in source:
                self._downward(target, source["downwardAPI"].get("items") or [], mode)

    async def write_token(self, path: Path, audience: str | None, expiry: int, mode: Any) -> None:
        """Request a token bound to the pod and write it to ``path``."""
        meta = self._pod["metadata"]
        sa = self._pod["spec"].get("serviceAccountName") or "default"
        spec: Obj = {
            "expirationSeconds": max(expiry, 600),
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "uid": meta["uid"],
            },
        }
        if audience:
            spec["audiences"] = [audience]
        answer = await self._api.post(
            f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{sa}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        _write(path, answer["status"]["token"].encode(), mode if isinstance(mode, int) else 0o644)

    def cleanup(self) -> None:
        """Remove the pod's volume directories (not hostPath/claims)."""
        shutil.rmtree(self._root, ignore_errors=True)


def ensure_mount_target(path: str, is_file: bool) -> None:
    """Create a missing mount point on the host (an empty directory or file)."""
    if os.path.lexists(path):
        return
    if is_file:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).touch()
    else:
        Path(path).mkdir(parents=True, exist_ok=True)
