"""The nodes' images, imported and unpacked once per machine: a node *seed*.

A seed is a containerd root (content store, overlayfs snapshots, metadata databases) in which
every image archive of a cluster was imported and unpacked by a node's containerd. It is kept
in the image cache under ``images/node-seeds/<key>``, ``key`` naming the archives (their names
carry their inputs' hash, so a rebuilt image makes a new seed and the older ones are removed).

A node's containerd root is planted from the seed before containerd starts: the image files
(content blobs and the unpacked layers under the snapshots) are hard links to the seed's, and
everything else (the bolt databases containerd writes in place) is copied. Neither containerd
nor the snapshotter ever writes a committed blob or layer file in place (a container writes to
its own upper directory; removing an image unlinks only the node's links), so the nodes can
share them. Planting takes about a second; importing the images into three nodes took a minute
on a 2-core machine, and each node's first worker pod spent 20 s unpacking the worker image.
Where the cache and the run directory are on different file systems, the seed is copied.

A new seed starts from the newest earlier one (planted the same way), so that only the layers
that changed are written and unpacked: a change to the project's code rebuilds the top layers
of its images, never the base or torch layers below them. The earlier images keep second names
while the new ones are imported (an import moves an image's name to the new image, and a
layer no image refers to may be collected in the middle of the import), then containerd
collects what the new images no longer refer to before the seed is kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from devcluster.filelock import waiting_lock

logger = logging.getLogger(__name__)

#: Where the seeds live, under the cache directory.
SEEDS_DIR: Final = Path("images") / "node-seeds"
#: The parts of a containerd root that hold image files, shared through hard links.
IMAGE_FILES: Final = (
    Path("io.containerd.content.v1.content") / "blobs",
    Path("io.containerd.snapshotter.v1.overlayfs") / "snapshots",
)
#: The file, beside a node's containerd root, that names the seed it was planted from.
PLANTED_FILE: Final = "seed"
#: How long an ``up`` waits for another one making the same seed.
LOCK_TIMEOUT_S: Final = 900.0


class SeedError(RuntimeError):
    """A seed could not be made or planted."""


def seed_key(archives: list[Path]) -> str:
    """The seed's name: a digest of the archives' names and sizes."""
    digest = hashlib.sha256()
    for archive in sorted(archives):
        digest.update(f"{archive.name}:{archive.stat().st_size}\n".encode())
    return digest.hexdigest()[:16]


class NodeSeed:
    """The seed of one set of image archives, in ``cache_dir``."""

    def __init__(self, cache_dir: Path, archives: list[Path]) -> None:
        self.archives = sorted(archives)
        self.key = seed_key(self.archives)
        self.dir = cache_dir / SEEDS_DIR
        self.root = self.dir / self.key

    def exists(self) -> bool:
        """True once the seed has been made (it appears whole, by a rename)."""
        return self.root.is_dir()

    @contextlib.contextmanager
    def locked(self, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
        """Hold the seeds' lock: one ``up`` makes a seed while another waits for it."""
        with waiting_lock(self.dir / ".lock", timeout, "the image seed", SeedError):
            yield

    def earlier(self) -> Path | None:
        """The newest seed made for other archives, if any (the one a new seed starts from)."""
        if not self.dir.is_dir():
            return None
        seeds = [
            path
            for path in self.dir.iterdir()
            if path.is_dir() and not path.name.startswith(".") and path != self.root
        ]
        return max(seeds, key=lambda path: path.stat().st_mtime, default=None)

    def begin(self, root: Path) -> bool:
        """Prepare ``root`` (node-1's containerd root, containerd stopped) for making the seed:
        planted from the newest earlier seed, whose unchanged layers the imports then find
        in place, or empty when there is none; True when it was planted."""
        shutil.rmtree(root, ignore_errors=True)
        earlier = self.earlier()
        if earlier is None:
            root.mkdir(parents=True)
            return False
        logger.info("starting the seed from the earlier seed %s", earlier.name)
        _plant(earlier, root)
        return True

    def keep(self, root: Path) -> None:
        """Make the seed from ``root``, a containerd root its containerd (now stopped) imported
        and unpacked the archives into; ``root`` is left empty. Older seeds are removed."""
        staging = self.dir / f".{self.key}-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            root.rename(staging)
        except OSError:
            _copy_tree(root, staging, link=False)
            shutil.rmtree(root)
        root.mkdir()
        staging.rename(self.root)
        for other in self.dir.iterdir():
            if other.is_dir() and other != self.root:
                shutil.rmtree(other, ignore_errors=True)

    def plant(self, root: Path) -> bool:
        """Give ``root`` (a node's containerd root, containerd stopped) the seed's images,
        unless it was planted from this seed already; True when it was planted now."""
        stamp = root.parent / PLANTED_FILE
        if root.is_dir() and stamp.exists() and stamp.read_text() == self.key:
            return False
        shutil.rmtree(root, ignore_errors=True)
        stamp.unlink(missing_ok=True)
        _plant(self.root, root)
        stamp.write_text(self.key)
        return True


def _plant(seed: Path, root: Path) -> None:
    """Fill ``root`` from the seed root ``seed``: image files linked, the rest copied (all
    copied where links cannot be made)."""
    try:
        _copy_tree(seed, root, link=True)
    except SeedError as err:
        logger.warning("%s; copying the seed instead of linking it", err)
        shutil.rmtree(root, ignore_errors=True)
        _copy_tree(seed, root, link=False)
    else:
        _own_copies(root)


def _copy_tree(source: Path, target: Path, *, link: bool) -> None:
    """``cp -a`` (with ``--link``: every file hard-linked), keeping owners, modes, device
    nodes (overlay whiteouts) and extended attributes (overlay opaque directories)."""
    argv = ["cp", "-a", *(["--link"] if link else []), f"{source}/.", str(target)]
    target.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SeedError(f"{' '.join(argv)}: {result.stderr.strip()}")


def _own_copies(root: Path) -> None:
    """Replace each hard link outside :data:`IMAGE_FILES` by a copy of its own (the
    databases and state containerd writes in place)."""
    shared = [root / part for part in IMAGE_FILES]
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [name for name in dirnames if here / name not in shared]
        for name in filenames:
            path = here / name
            if path.is_symlink() or not path.is_file() or path.stat().st_nlink < 2:
                continue
            own = path.with_name(f".{name}.own")
            shutil.copy2(path, own)
            own.replace(path)
