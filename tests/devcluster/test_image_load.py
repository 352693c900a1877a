"""The thin archive of an image loaded into running nodes (``devcluster/imageload.py``): the
manifest, the configuration and only the layers the nodes do not hold, named for containerd.
(Loading one into real nodes and running it: ``tests/e2e/test_your_first_job.py``.)"""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

import pytest

from devcluster.buildah import ImageBuildError
from devcluster.imageload import thin_archive


def put(layout: Path, content: bytes) -> str:
    digest = hashlib.sha256(content).hexdigest()
    blob = layout / "blobs" / "sha256" / digest
    blob.parent.mkdir(parents=True, exist_ok=True)
    blob.write_bytes(content)
    return f"sha256:{digest}"


def layout_with(tmp_path: Path, name: str) -> tuple[Path, list[str]]:
    """A layout holding ``name``: three layers, the first two the base's (diff IDs b1, b2)."""
    layout = tmp_path / "layout"
    layers = [put(layout, f"layer {i}".encode()) for i in range(3)]
    config = put(layout, json.dumps({"rootfs": {"diff_ids": ["b1", "b2", "new"]}}).encode())
    media = "application/vnd.oci.image.layer.v1.tar+gzip"
    manifest = {
        "config": {"digest": config},
        "layers": [{"digest": d, "mediaType": media} for d in layers],
    }
    digest = put(layout, json.dumps(manifest).encode())
    descriptor = {"digest": digest, "annotations": {"org.opencontainers.image.ref.name": name}}
    (layout / "index.json").write_text(json.dumps({"manifests": [descriptor]}))
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return layout, [digest, config, *layers]


def test_the_archive_holds_what_the_nodes_lack_and_names_the_image(tmp_path: Path) -> None:
    name = "registry.example.com/team/train:1"
    layout, (manifest, config, _, _, new_layer) = layout_with(tmp_path, name)
    archive = thin_archive(layout, name, {"b1", "b2"}, tmp_path / "thin.tar")
    with tarfile.open(archive) as tar:
        members = set(tar.getnames())
        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
    blobs = {f"blobs/sha256/{d.split(':')[1]}" for d in (manifest, config, new_layer)}
    assert members == {"oci-layout", "index.json", *blobs}
    (described,) = index["manifests"]
    assert described["digest"] == manifest
    assert described["annotations"]["io.containerd.image.name"] == name


def test_an_image_not_in_the_layout_is_named(tmp_path: Path) -> None:
    layout, _ = layout_with(tmp_path, "a:1")
    with pytest.raises(ImageBuildError, match="holds no image named b:1"):
        thin_archive(layout, "b:1", set(), tmp_path / "thin.tar")
