"""The image seed of real nodes (devcluster.nodeseed) on real files: what the nodes share by
hard links and what each owns. A real containerd using a planted root is what every real-node
test does."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devcluster.config import ClusterConfig
from devcluster.imageload import chain_ids, thin_docker_archive
from devcluster.nodes import RealNode
from devcluster.nodeseed import IMAGE_FILES, NodeSeed
from tests.support.image_archives import docker_archive, layer_tar

BLOB = IMAGE_FILES[0] / "sha256" / "ab12"
LAYER_FILE = IMAGE_FILES[1] / "1" / "fs" / "usr" / "lib" / "libtorch.so"
WHITEOUT = IMAGE_FILES[1] / "2" / "fs" / "etc" / "gone"
OPAQUE_DIR = IMAGE_FILES[1] / "2" / "fs" / "opt"
DATABASE = Path("io.containerd.metadata.v1.bolt") / "meta.db"
SNAPSHOT_DATABASE = Path("io.containerd.snapshotter.v1.overlayfs") / "metadata.db"


def _archives(tmp_path: Path, worker_hash: str) -> list[Path]:
    archives = []
    for name in ("pause_3.2-1.tar", f"worker_0.1.0-{worker_hash}.tar"):
        archive = tmp_path / "archives" / name
        archive.parent.mkdir(parents=True, exist_ok=True)
        archive.write_bytes(b"image")
        archives.append(archive)
    return archives


def _imported_root(root: Path) -> Path:
    """What a containerd leaves after importing and unpacking an image (a few of its files)."""
    for path, text in ((BLOB, "layer tar"), (LAYER_FILE, "code"), (DATABASE, "images")):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    (root / SNAPSHOT_DATABASE).write_text("snapshots")
    (root / OPAQUE_DIR).mkdir(parents=True)
    (root / WHITEOUT).parent.mkdir(parents=True)
    if os.geteuid() == 0:
        os.mknod(root / WHITEOUT, 0o20000 | 0o600, os.makedev(0, 0))
        os.setxattr(root / OPAQUE_DIR, "trusted.overlay.opaque", b"y")
    return root


def test_a_kept_seed_replaces_the_older_ones_and_leaves_the_root_empty(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    old = NodeSeed(cache, _archives(tmp_path, "aaaa"))
    old.keep(_imported_root(tmp_path / "old-root"))
    new = NodeSeed(cache, _archives(tmp_path / "new", "bbbb"))
    assert new.key != old.key and not new.exists()

    root = _imported_root(tmp_path / "node-1" / "root")
    new.keep(root)

    assert new.exists() and not old.exists()
    assert root.is_dir() and not any(root.iterdir())
    assert (new.root / LAYER_FILE).read_text() == "code"


def test_a_planted_root_links_the_image_files_and_owns_the_databases(tmp_path: Path) -> None:
    seed = NodeSeed(tmp_path / "cache", _archives(tmp_path, "aaaa"))
    seed.keep(_imported_root(tmp_path / "made"))
    roots = [tmp_path / f"node-{i}" / "root" for i in (1, 2)]

    assert all(seed.plant(root) for root in roots)

    for root in roots:
        for shared in (BLOB, LAYER_FILE):
            assert (root / shared).stat().st_ino == (seed.root / shared).stat().st_ino
        for own in (DATABASE, SNAPSHOT_DATABASE):
            assert (root / own).stat().st_ino != (seed.root / own).stat().st_ino
            assert (root / own).stat().st_nlink == 1
    (roots[0] / DATABASE).write_text("node-1's images")
    assert (roots[1] / DATABASE).read_text() == (seed.root / DATABASE).read_text() == "images"


def test_a_root_is_planted_again_only_when_the_images_changed(tmp_path: Path) -> None:
    seed = NodeSeed(tmp_path / "cache", _archives(tmp_path, "aaaa"))
    seed.keep(_imported_root(tmp_path / "made"))
    root = tmp_path / "node-1" / "root"
    assert seed.plant(root)
    (root / "left-by-a-pod").write_text("kept")

    assert not seed.plant(root)
    assert (root / "left-by-a-pod").exists()

    newer = NodeSeed(tmp_path / "cache", _archives(tmp_path / "new", "bbbb"))
    newer.keep(_imported_root(tmp_path / "made-again"))
    assert newer.plant(root)
    assert not (root / "left-by-a-pod").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="overlay whiteouts and xattrs need root")
def test_overlay_whiteouts_and_opaque_directories_survive_planting(tmp_path: Path) -> None:
    seed = NodeSeed(tmp_path / "cache", _archives(tmp_path, "aaaa"))
    seed.keep(_imported_root(tmp_path / "made"))
    root = tmp_path / "node-1" / "root"

    seed.plant(root)

    whiteout = (root / WHITEOUT).stat()
    assert os.major(whiteout.st_rdev) == 0 and os.minor(whiteout.st_rdev) == 0
    assert (whiteout.st_mode & 0o170000) == 0o20000
    assert os.getxattr(root / OPAQUE_DIR, "trusted.overlay.opaque") == b"y"


def test_a_new_seed_starts_from_the_newest_earlier_one(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = NodeSeed(cache, _archives(tmp_path, "aaaa"))
    root = tmp_path / "node-1" / "root"
    assert first.earlier() is None
    assert not first.begin(root)
    assert root.is_dir() and not any(root.iterdir())
    first.keep(_imported_root(root))

    second = NodeSeed(cache, _archives(tmp_path / "new", "bbbb"))
    assert second.earlier() == first.root
    assert second.begin(root)

    # The earlier seed's image files are in place (linked), its databases node-1's own.
    assert (root / LAYER_FILE).stat().st_ino == (first.root / LAYER_FILE).stat().st_ino
    assert (root / DATABASE).stat().st_ino != (first.root / DATABASE).stat().st_ino
    (root / DATABASE).write_text("the new images")
    second.keep(root)
    assert not first.exists()
    assert (second.root / DATABASE).read_text() == "the new images"
    assert (second.root / LAYER_FILE).read_text() == "code"


@pytest.fixture
def containerd_node() -> Iterator[RealNode]:
    """A real containerd (no CRI) serving node-1 of a throwaway run directory."""
    if os.geteuid() != 0 or shutil.which("containerd") is None:
        pytest.skip("needs root and containerd")
    run_dir = Path(tempfile.mkdtemp(prefix="ejseed-"))  # short: the socket's path
    node = RealNode(ClusterConfig(run_dir=run_dir, runtime="containerd", nodes=1), 1)
    node.socket.parent.mkdir(parents=True)
    config = node.containerd_dir / "config.toml"
    config.write_text(
        f'version = 2\nroot = "{node.containerd_root}"\nstate = "{node.socket.parent}"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'[grpc]\n  address = "{node.socket}"\n'
    )
    log = (node.containerd_dir / "containerd.log").open("w")
    daemon = subprocess.Popen(["containerd", "--config", str(config)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while node.ctr("version").returncode != 0:
            assert daemon.poll() is None and time.monotonic() < deadline, "containerd not up"
            time.sleep(0.1)
        yield node
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        log.close()
        shutil.rmtree(run_dir)


def _collect(node: RealNode) -> None:
    """containerd's garbage collection, now (as its scheduler may run it at any time)."""
    for argv in (
        ("images", "tag", "--force", TAG, "devcluster.test/collect:now"),
        ("images", "delete", "--sync", "devcluster.test/collect:now"),
    ):
        assert node.ctr(*argv).returncode == 0


TAG = "devcluster.test/image:1"


def test_held_images_keep_their_layers_while_imports_replace_them(
    containerd_node: RealNode, tmp_path: Path
) -> None:
    node = containerd_node
    base, one, two = (layer_tar(name) for name in ("base", "one", "two"))
    node.import_image(docker_archive(tmp_path / "v1.tar", TAG, [base, one]))
    v1_chain = chain_ids([base[0], one[0]])
    v2_chain = chain_ids([base[0], two[0]])
    assert set(v1_chain) <= node.unpacked_layers()

    node.hold_images()
    # The import moves the name to the new image before it unpacks its layers; a collection
    # in between would remove the old image's layers, the shared base among them.
    moved = node.ctr(
        "images",
        "import",
        "--no-unpack",
        str(docker_archive(tmp_path / "v2.tar", TAG, [base, two])),
    )
    assert moved.returncode == 0, moved.stderr
    _collect(node)
    assert set(v1_chain) <= node.unpacked_layers()

    node.import_image(tmp_path / "v2.tar")
    node.release_images()
    assert node.unpacked_layers() == set(v2_chain)
    assert node.ctr("images", "list", "--quiet").stdout.split() == [TAG]


def test_a_thin_archive_unpacks_the_new_layers_on_those_the_node_holds(
    containerd_node: RealNode, tmp_path: Path
) -> None:
    """What a seed made from an earlier one imports: only the layer the node lacks travels,
    and the new image's chain stands on the base's snapshot."""
    node = containerd_node
    base, one, two = (layer_tar(name) for name in ("base", "one", "two"))
    node.import_image(docker_archive(tmp_path / "v1.tar", TAG, [base, one]))
    node.hold_images()
    v2, thin = docker_archive(tmp_path / "v2.tar", TAG, [base, two]), tmp_path / "thin.tar"

    assert thin_docker_archive(v2, node.unpacked_layers(), thin)

    with tarfile.open(thin) as tar:
        blobs = {name.rsplit("/", 1)[-1] for name in tar.getnames()}
    assert two[0][7:] in blobs and base[0][7:] not in blobs and one[0][7:] not in blobs
    node.import_image(thin)
    node.release_images()
    assert node.unpacked_layers() == set(chain_ids([base[0], two[0]]))
    assert node.ctr("images", "list", "--quiet").stdout.split() == [TAG]
