"""The image seed of real nodes (devcluster.nodeseed) on real files: what the nodes share by
hard links and what each owns. A real containerd using a planted root is what every real-node
test does."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devcluster.nodeseed import IMAGE_FILES, NodeSeed

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
