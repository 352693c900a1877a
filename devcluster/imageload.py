"""An image of a user's own, built on an image the real nodes already hold, and loaded into
every node of a running cluster without a registry.

A cluster's images come from its nodes' seed, made at ``up`` (:mod:`devcluster.nodeseed`). An
image built later (a user's ``FROM elasticjob/worker`` Dockerfile) would cost a full archive,
1.4 GB for the worker image, imported once per node. Here only what the nodes lack travels:

1. buildah builds the Dockerfile (its ``FROM`` must be in the build store: the worker and
   operator images are);
2. the new image is pushed into an OCI image layout kept in the image cache (a blob already
   there is not written again);
3. a *thin* OCI archive holds the new image's manifest, its configuration and the layers that
   are not the base's (the base's diff IDs, from its configuration); each node's containerd
   imports it and unpacks it on the base's layers, which its content store holds.
"""

from __future__ import annotations

import io
import json
import logging
import tarfile
import time
from pathlib import Path
from typing import Any

from devcluster.buildah import Buildah, ImageBuildError
from devcluster.config import ClusterConfig
from devcluster.imagebuild import build_lock
from devcluster.nodes import real_nodes

logger = logging.getLogger(__name__)

_REF_NAME = "org.opencontainers.image.ref.name"
_IMAGE_NAME = "io.containerd.image.name"


def _blob(layout: Path, digest: str) -> Path:
    algorithm, hex_digest = digest.split(":", 1)
    return layout / "blobs" / algorithm / hex_digest


def _manifest(layout: Path, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The descriptor and the manifest of the image ``name`` in ``layout``."""
    index = json.loads((layout / "index.json").read_text())
    for descriptor in index.get("manifests", []):
        if (descriptor.get("annotations") or {}).get(_REF_NAME) == name:
            return descriptor, json.loads(_blob(layout, descriptor["digest"]).read_bytes())
    raise ImageBuildError(f"{layout} holds no image named {name}")


def thin_archive(layout: Path, name: str, held: set[str], archive: Path) -> Path:
    """Write to ``archive`` the image ``name`` of ``layout`` less the layers whose diff IDs
    are ``held`` (the nodes have them unpacked: containerd finds their snapshots by the
    chain of diff IDs and needs no blob)."""
    descriptor, manifest = _manifest(layout, name)
    config = json.loads(_blob(layout, manifest["config"]["digest"]).read_bytes())
    diff_ids = config["rootfs"]["diff_ids"]
    blobs = [descriptor["digest"], manifest["config"]["digest"]]
    blobs += [
        layer["digest"]
        for layer, diff_id in zip(manifest["layers"], diff_ids, strict=True)
        if diff_id not in held
    ]
    named = {**descriptor, "annotations": {_REF_NAME: name, _IMAGE_NAME: name}}
    index = {"schemaVersion": 2, "manifests": [named]}
    with tarfile.open(archive, "w") as tar:
        for member, content in (
            ("oci-layout", (layout / "oci-layout").read_bytes()),
            ("index.json", json.dumps(index).encode()),
        ):
            info = tarfile.TarInfo(member)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
        for digest in blobs:
            algorithm, hex_digest = digest.split(":", 1)
            tar.add(_blob(layout, digest), f"blobs/{algorithm}/{hex_digest}")
    return archive


def load_image(cfg: ClusterConfig, context: Path, dockerfile: Path, name: str, base: str) -> float:
    """Build ``name`` from ``dockerfile`` (its ``FROM`` is ``base``, an image the nodes hold)
    and load it into every real node of ``cfg``'s cluster; return the seconds it took."""
    if cfg.runtime != "containerd":
        raise ImageBuildError("images are loaded into real nodes only (runtime containerd)")
    started = time.monotonic()
    images = cfg.cache_dir / "images"
    layout = images / "oci-layout"
    with build_lock(cfg.cache_dir):
        buildah = Buildah(images / "store")
        buildah.bud(context, dockerfile, name, [])
        rootfs: Any = buildah.inspect(base)["rootfs"]
        held = set(rootfs["diff_ids"])
        buildah.push(name, f"oci:{layout}:{name}", timeout=600)
        archive = cfg.run_dir / f"{name.replace('/', '_')}.tar"
        thin_archive(layout, name, held, archive)
    for node in real_nodes(cfg):
        node.import_image(archive)
    archive.unlink()
    seconds = time.monotonic() - started
    logger.info("loaded %s into the nodes in %.1f s", name, seconds)
    return seconds
