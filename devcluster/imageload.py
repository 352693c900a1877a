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
   are not the base's (by chain ID, from the base's configuration); each node's containerd
   imports it and unpacks it on the base's layers, which it holds unpacked.

A node seed made from an earlier one imports the images the same way
(:func:`thin_docker_archive`): only the layers the earlier seed lacks, out of the image cache's
docker-archives.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from devcluster.buildah import Buildah, ImageBuildError
from devcluster.config import ClusterConfig
from devcluster.imagebuild import build_lock
from devcluster.nodes import real_nodes

logger = logging.getLogger(__name__)

_REF_NAME = "org.opencontainers.image.ref.name"
_IMAGE_NAME = "io.containerd.image.name"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
"""An uncompressed layer: its digest is its diff ID (a docker-archive's layers are)."""
OCI_LAYOUT = b'{"imageLayoutVersion": "1.0.0"}'


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


def _digest(content: bytes) -> str:
    return f"sha256:{hashlib.sha256(content).hexdigest()}"


def chain_ids(diff_ids: list[str]) -> list[str]:
    """The chain ID of each layer of an image whose layers have the diff IDs ``diff_ids``
    (the OCI image spec's ChainID): the name containerd gives the snapshot of that layer
    unpacked on the layers below it."""
    chains: list[str] = []
    for diff_id in diff_ids:
        chains.append(_digest(f"{chains[-1]} {diff_id}".encode()) if chains else diff_id)
    return chains


def _lacking(diff_ids: list[str], held: set[str]) -> list[bool]:
    """For each layer: whether a node whose unpacked layers have the chain IDs ``held`` lacks
    it (then the layers above it are new to the node as well)."""
    return [chain not in held for chain in chain_ids(diff_ids)]


def _write_oci_archive(
    archive: Path,
    name: str,
    manifest: bytes,
    blobs: list[tuple[str, Callable[[], IO[bytes]]]],
    media_type: str = MANIFEST_MEDIA_TYPE,
) -> None:
    """An OCI archive that ``ctr images import`` names ``name``: its manifest (``manifest``,
    of ``media_type``) and the blobs of ``blobs`` (digest, and how to open its content)."""
    digest = _digest(manifest)
    descriptor = {"mediaType": media_type, "digest": digest, "size": len(manifest)}
    named = {**descriptor, "annotations": {_REF_NAME: name, _IMAGE_NAME: name}}
    index = {"schemaVersion": 2, "manifests": [named]}
    with tarfile.open(archive, "w") as tar:

        def add(member: str, size: int, content: IO[bytes]) -> None:
            info = tarfile.TarInfo(member)
            info.size = size
            tar.addfile(info, content)

        add("oci-layout", len(OCI_LAYOUT), io.BytesIO(OCI_LAYOUT))
        index_bytes = json.dumps(index).encode()
        add("index.json", len(index_bytes), io.BytesIO(index_bytes))
        add(f"blobs/sha256/{digest.split(':', 1)[1]}", len(manifest), io.BytesIO(manifest))
        for blob_digest, open_blob in blobs:
            with open_blob() as content:
                size = _size(content)
                add(f"blobs/sha256/{blob_digest.split(':', 1)[1]}", size, content)


def _size(content: IO[bytes]) -> int:
    """The size of a seekable file, left at its start."""
    size = content.seek(0, io.SEEK_END)
    content.seek(0)
    return size


def _opener(path: Path) -> Callable[[], IO[bytes]]:
    return lambda: path.open("rb")


def thin_archive(layout: Path, name: str, held: set[str], archive: Path) -> Path:
    """Write to ``archive`` the image ``name`` of ``layout`` less the layers the nodes hold
    unpacked (their chain IDs are ``held``: containerd finds their snapshots by chain ID and
    needs no blob)."""
    descriptor, manifest = _manifest(layout, name)
    config = json.loads(_blob(layout, manifest["config"]["digest"]).read_bytes())
    lacking = _lacking(config["rootfs"]["diff_ids"], held)
    layers = [layer["digest"] for layer in manifest["layers"]]
    digests = [manifest["config"]["digest"]]
    digests += [digest for digest, lacks in zip(layers, lacking, strict=True) if lacks]
    blobs = [(d, _opener(_blob(layout, d))) for d in digests]
    manifest_bytes = _blob(layout, descriptor["digest"]).read_bytes()
    media_type = descriptor.get("mediaType", MANIFEST_MEDIA_TYPE)
    _write_oci_archive(archive, name, manifest_bytes, blobs, media_type)
    return archive


def thin_docker_archive(archive: Path, held: set[str], thin: Path) -> bool:
    """Write to ``thin``, as an OCI archive, the image of the docker-archive ``archive`` (one
    image, its layers uncompressed, as ``buildah push`` writes it) less the layers a node
    holds unpacked (chain IDs ``held``); False, writing nothing, when the node holds none of
    them (``archive`` itself is then what it lacks). Only the missing layers are read."""
    with tarfile.open(archive) as tar:

        def opener(member: str) -> Callable[[], IO[bytes]]:
            def open_member() -> IO[bytes]:  # a link's target where the member is a link
                content = tar.extractfile(member)
                if content is None:
                    raise ImageBuildError(f"{archive} has no file {member}")
                return content

            return open_member

        (entry,) = json.loads(opener("manifest.json")().read())
        config = opener(entry["Config"])().read()
        diff_ids: list[str] = json.loads(config)["rootfs"]["diff_ids"]
        lacking = _lacking(diff_ids, held)
        if all(lacking):
            return False
        layers = []
        for diff_id, file in zip(diff_ids, entry["Layers"], strict=True):
            with opener(file)() as content:
                size = _size(content)
            layers.append({"mediaType": LAYER_MEDIA_TYPE, "digest": diff_id, "size": size})
        config_digest = _digest(config)
        described = {"mediaType": CONFIG_MEDIA_TYPE, "digest": config_digest, "size": len(config)}
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": described,
            "layers": layers,
        }
        blobs = [(config_digest, opener(entry["Config"]))]
        for diff_id, file, lacks in zip(diff_ids, entry["Layers"], lacking, strict=True):
            if lacks:
                blobs.append((diff_id, opener(file)))
        (name,) = entry["RepoTags"]
        _write_oci_archive(thin, name, json.dumps(manifest).encode(), blobs)
    return True


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
        held = set(chain_ids(rootfs["diff_ids"]))
        buildah.push(name, f"oci:{layout}:{name}", timeout=600)
        archive = cfg.run_dir / f"{name.replace('/', '_')}.tar"
        thin_archive(layout, name, held, archive)
    for node in real_nodes(cfg):
        node.import_image(archive)
    archive.unlink()
    seconds = time.monotonic() - started
    logger.info("loaded %s into the nodes in %.1f s", name, seconds)
    return seconds
