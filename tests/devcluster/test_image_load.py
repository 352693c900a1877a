"""Thin archives (``devcluster/imageload.py``): an image's manifest, configuration and only the
layers a node does not hold unpacked (by chain ID), named for containerd; from the OCI layout
an image of one's own is pushed to, or from a docker-archive of the image cache (what a node
seed made from an earlier one imports). (Loading one into real nodes and running it:
``tests/e2e/test_your_first_job.py``; a seed made from an earlier one: every real-node session
after a change to the project's code.)"""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

import pytest

from devcluster.buildah import ImageBuildError
from devcluster.imageload import LAYER_MEDIA_TYPE, chain_ids, thin_archive, thin_docker_archive
from tests.support.image_archives import docker_archive, layer_tar


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
    archive = thin_archive(layout, name, set(chain_ids(["b1", "b2"])), tmp_path / "thin.tar")
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


def test_a_layer_is_held_only_on_the_layers_held_below_it(tmp_path: Path) -> None:
    """A node holding b1 and b2 unpacked, but not on each other, lacks b2 on b1: the layer's
    diff ID alone does not make it held."""
    name = "registry.example.com/team/train:1"
    layout, (manifest, config, _, layer_b2, new_layer) = layout_with(tmp_path, name)
    held = {chain_ids(["b1"])[0], chain_ids(["b2"])[0]}
    with tarfile.open(thin_archive(layout, name, held, tmp_path / "thin.tar")) as tar:
        members = set(tar.getnames())
    blobs = {f"blobs/sha256/{d.split(':')[1]}" for d in (manifest, config, layer_b2, new_layer)}
    assert members == {"oci-layout", "index.json", *blobs}


def test_chain_ids_follow_the_image_spec() -> None:
    first, second = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    below = hashlib.sha256(f"{first} {second}".encode()).hexdigest()
    assert chain_ids([first, second]) == [first, f"sha256:{below}"]
    assert chain_ids([]) == []


def test_a_docker_archive_becomes_an_oci_archive_of_what_the_node_lacks(tmp_path: Path) -> None:
    name = "docker.io/elasticjob/worker:0.1.0"
    layers = [layer_tar(name) for name in ("debian", "torch", "the project, changed")]
    docker_archive(tmp_path / "worker.tar", name, layers)
    diff_ids = [diff_id for diff_id, _ in layers]
    held = set(chain_ids(diff_ids[:2]))
    with tarfile.open(tmp_path / "worker.tar") as tar:
        config = tar.extractfile("config.json").read()  # type: ignore[union-attr]

    assert thin_docker_archive(tmp_path / "worker.tar", held, tmp_path / "thin.tar")

    with tarfile.open(tmp_path / "thin.tar") as tar:

        def read(member: str) -> bytes:
            content = tar.extractfile(member)
            assert content is not None, member
            return content.read()

        (described,) = json.loads(read("index.json"))["manifests"]
        assert described["annotations"]["io.containerd.image.name"] == name
        manifest_bytes = read(f"blobs/sha256/{described['digest'].split(':')[1]}")
        assert described["digest"] == f"sha256:{hashlib.sha256(manifest_bytes).hexdigest()}"
        manifest = json.loads(manifest_bytes)
        assert [layer["digest"] for layer in manifest["layers"]] == diff_ids
        assert {layer["mediaType"] for layer in manifest["layers"]} == {LAYER_MEDIA_TYPE}
        assert [layer["size"] for layer in manifest["layers"]] == [len(b) for _, b in layers]
        config_digest = manifest["config"]["digest"]
        assert read(f"blobs/sha256/{config_digest.split(':')[1]}") == config
        blobs = {m for m in tar.getnames() if m.startswith("blobs/")}
    new_layer = f"blobs/sha256/{diff_ids[2].split(':')[1]}"
    assert new_layer in blobs and len(blobs) == 3  # the manifest, the config, the new layer
    with tarfile.open(tmp_path / "thin.tar") as tar:
        assert tar.extractfile(new_layer).read() == layers[2][1]  # type: ignore[union-attr]


def test_a_node_holding_nothing_of_an_image_imports_the_archive_itself(tmp_path: Path) -> None:
    one, two = layer_tar("one"), layer_tar("two")
    docker_archive(tmp_path / "worker.tar", "a:1", [one, two])
    held = {two[0]}  # the second layer, unpacked alone (not on the first)

    assert not thin_docker_archive(tmp_path / "worker.tar", held, tmp_path / "thin.tar")
    assert not (tmp_path / "thin.tar").exists()
