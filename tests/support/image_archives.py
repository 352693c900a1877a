"""Small docker-archives (``docker save``'s format) for the tests of what real nodes import:
layers of one file each, an image configuration naming their diff IDs."""

from __future__ import annotations

import hashlib
import io
import json
import platform
import tarfile
from pathlib import Path


def layer_tar(name: str) -> tuple[str, bytes]:
    """A layer tar holding one file, ``<name>.txt``, and its diff ID."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        data = name.encode()
        info = tarfile.TarInfo(f"{name}.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    blob = buffer.getvalue()
    return f"sha256:{hashlib.sha256(blob).hexdigest()}", blob


def docker_archive(path: Path, tag: str, layers: list[tuple[str, bytes]]) -> Path:
    """A ``docker save`` archive at ``path`` of the image ``tag`` made of ``layers`` (diff ID
    and tar each, lowest first)."""
    config = json.dumps(
        {
            "architecture": {"x86_64": "amd64", "aarch64": "arm64"}[platform.machine()],
            "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": [diff for diff, _ in layers]},
            "config": {},
        }
    ).encode()
    members = {f"{diff[7:]}/layer.tar": blob for diff, blob in layers}
    members["config.json"] = config
    manifest = [{"Config": "config.json", "RepoTags": [tag], "Layers": list(members)[:-1]}]
    members["manifest.json"] = json.dumps(manifest).encode()
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path
