"""The images real nodes run, built here without a registry.

:func:`ensure_images` builds, or finds in its cache, four images and exports each to a tar that
``ctr -n k8s.io images import`` loads under the name pods use:

- :data:`PAUSE_IMAGE`, the kubelet's sandbox image: only the static ``pause`` binary that
  ``scripts/devcluster-prereqs.sh`` builds beside kubelet;
- :data:`BASE_IMAGE`, Debian from Debian's packages (``debootstrap --variant=minbase`` on the
  mirror apt uses here, :data:`BASE_MINIMAL_IMAGE`) plus python3 and python3-venv;
- ``elasticjob/operator:<chart appVersion>`` and ``elasticjob/worker:<project version>``, from
  ``Dockerfile.operator`` and ``Dockerfile.worker`` built on that base by buildah, with the
  machine's pip configuration passed in (:mod:`devcluster.pipconf`).

Every image is cached by a hash of its inputs (the pause binary; the suite and mirror; the
Dockerfile, the files its ``COPY`` lines take, the base and the pip settings): when nothing
changed, :func:`ensure_images` returns without running buildah. Builds use cached layers, so a
change to the project's sources rebuilds only the layers after its ``COPY``.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import shlex
import tarfile
import time
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from devcluster.build import BuildError, cached_pause
from devcluster.buildah import (
    BUILD_TIMEOUT,
    Buildah,
    ImageBuildError,
    debian_mirror,
    debootstrap_rootfs,
)
from devcluster.config import REPO_ROOT
from devcluster.filelock import waiting_lock
from devcluster.pipconf import PipSettings, pip_settings

logger = logging.getLogger(__name__)

#: The sandbox image a 1.20 kubelet uses by default.
PAUSE_IMAGE = "k8s.gcr.io/pause:3.2"
BASE_MINIMAL_IMAGE = "docker.io/elasticjob/debian:bookworm-minbase"
BASE_IMAGE = "docker.io/elasticjob/debian:bookworm"
#: What :data:`BASE_IMAGE` adds to the minimal base: the Python the torch wheel needs (3.11).
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
OPERATOR_REPOSITORY = "docker.io/elasticjob/operator"
WORKER_REPOSITORY = "docker.io/elasticjob/worker"
CHART = REPO_ROOT / "deploy" / "helm" / "elasticjob-operator" / "Chart.yaml"
#: Bump when the way images are built changes: part of every cache key.
BUILDER_VERSION = 2
#: Files never copied into images nor hashed (also in .dockerignore).
IGNORED_DIRS = frozenset({"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"})
IGNORED_SUFFIXES = (".pyc", ".pyo")
#: Seconds between two tries to take the build lock.
BASE_CONFIG = (
    "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "--env", "LANG=C.UTF-8",
    "--cmd", '["/bin/bash"]',
)  # fmt: skip


@dataclass(frozen=True)
class BuiltImage:
    """An image and the archive that ``ctr -n k8s.io images import`` loads."""

    #: Fully qualified, as the kubelet normalises it (``docker.io/elasticjob/worker:0.1.0``).
    name: str
    archive: Path
    #: Seconds this call spent building it; None when it came from the cache.
    build_seconds: float | None = None


def chart_app_version(chart: Path = CHART) -> str:
    """The chart's ``appVersion``: the operator image's tag the chart uses by default."""
    match = re.search(r'^appVersion:\s*"?([^"\s]+)"?\s*$', chart.read_text(), re.MULTILINE)
    if match is None:
        raise ImageBuildError(f"no appVersion in {chart}")
    return match.group(1)


def project_version(root: Path = REPO_ROOT) -> str:
    """The project's version (pyproject.toml): the worker image's tag."""
    version: str = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    return version


def operator_image() -> str:
    """``docker.io/elasticjob/operator:<chart appVersion>``."""
    return f"{OPERATOR_REPOSITORY}:{chart_app_version()}"


def worker_image() -> str:
    """``docker.io/elasticjob/worker:<project version>``."""
    return f"{WORKER_REPOSITORY}:{project_version()}"


def copy_sources(dockerfile: Path) -> list[str]:
    """The context paths the Dockerfile's ``COPY`` instructions take (``--from`` excluded)."""
    sources: list[str] = []
    text = dockerfile.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        words = shlex.split(line.strip()) if line.strip().upper().startswith("COPY ") else []
        if any(w.startswith("--from") for w in words):
            continue
        sources += [w for w in words[1:-1] if not w.startswith("--")]
    return sources


def _files(path: Path) -> Iterator[Path]:
    if path.is_symlink() or path.is_file():
        yield path
        return
    for child in sorted(path.iterdir()):
        if child.name in IGNORED_DIRS or child.name.endswith(IGNORED_SUFFIXES):
            continue
        yield from _files(child)


def context_digest(root: Path, sources: list[str]) -> str:
    """A hash of every file (names, modes, contents; symlinks as links) under ``sources``."""
    digest = hashlib.sha256()
    for source in sources:
        for path in _files(root / source):
            digest.update(str(path.relative_to(root)).encode() + b"\0")
            if path.is_symlink():
                digest.update(b"link:" + str(path.readlink()).encode())
            else:
                digest.update(oct(path.stat().st_mode & 0o111).encode() + path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()


def archive_image_id(archive: Path) -> str:
    """The image ID (configuration digest) of the image in a docker-archive tar."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("manifest.json")
        if member is None:
            raise ImageBuildError(f"{archive} has no manifest.json")
        (manifest,) = json.load(member)
    config: str = manifest["Config"]
    return config.removesuffix(".json")


def _key(*parts: str) -> str:
    return hashlib.sha256("\0".join([str(BUILDER_VERSION), *parts]).encode()).hexdigest()[:16]


def _slug(image: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", image.split("/", 1)[-1])


class ImageBuilder:
    """Builds and caches the images under ``cache_dir/images``."""

    def __init__(self, cache_dir: Path, *, rebuild: bool = False) -> None:
        self.root = cache_dir / "images"
        self.archives = self.root / "archives"
        self.rebuild = rebuild
        self.buildah = Buildah(self.root / "store")
        self._pip: PipSettings | None = None
        self._base_keys: dict[str, str] = {}

    @property
    def pip(self) -> PipSettings:
        """The machine's pip settings (read once)."""
        if self._pip is None:
            self._pip = pip_settings()
        return self._pip

    def _cached(self, image: str, key: str, build: Callable[[], None]) -> BuiltImage:
        archive = self.archives / f"{_slug(image)}-{key}.tar"
        if archive.exists() and not self.rebuild:
            logger.debug("%s is cached in %s", image, archive)
            return BuiltImage(image, archive)
        self.archives.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        logger.info("building %s", image)
        build()
        self.buildah.export(image, archive)
        for old in self.archives.glob(f"{_slug(image)}-*.tar"):
            if old != archive:
                old.unlink()
        seconds = time.monotonic() - started
        logger.info("built %s in %.1f s (%s)", image, seconds, archive)
        return BuiltImage(image, archive, seconds)

    def ensure_in_store(self, built: BuiltImage) -> None:
        """Load ``built`` from its archive when the build store lacks that very image (not
        only its name: another build may have tagged a different one)."""
        if self.buildah.image_id(built.name) != archive_image_id(built.archive):
            self.buildah.load(built.archive, built.name)

    def pause(self) -> BuiltImage:
        """The sandbox image: only ``/pause``, run as 65535 like the upstream image."""
        binary = cached_pause(self.root.parent)
        if binary is None or not binary.exists():
            raise BuildError(
                f"no pause binary in {self.root.parent}; run scripts/devcluster-prereqs.sh"
            )
        content = binary.read_bytes()

        def build() -> None:
            tar = self.root / "pause-rootfs.tar"
            with tarfile.open(tar, "w") as out:
                info = tarfile.TarInfo("pause")
                info.size, info.mode = len(content), 0o755
                out.addfile(info, io.BytesIO(content))
            config = ["--entrypoint", '["/pause"]', "--user", "65535:65535"]
            self.buildah.from_rootfs(PAUSE_IMAGE, tar, config)
            tar.unlink()

        return self._cached(PAUSE_IMAGE, _key("pause", hashlib.sha256(content).hexdigest()), build)

    def base_minimal(self) -> BuiltImage:
        """Debian ``minbase`` from debootstrap, nothing added (no Python)."""
        key = _key("minbase", debian_mirror() or "")

        def build() -> None:
            work = self.root / "debootstrap"
            work.mkdir(parents=True, exist_ok=True)
            tar = work / "rootfs.tar"
            debootstrap_rootfs(work, tar)
            self.buildah.from_rootfs(BASE_MINIMAL_IMAGE, tar, BASE_CONFIG)
            tar.unlink()

        built = self._cached(BASE_MINIMAL_IMAGE, key, build)
        self._base_keys[BASE_MINIMAL_IMAGE] = key
        return built

    def base(self) -> BuiltImage:
        """The minimal base plus :data:`BASE_PACKAGES` (python3, python3-venv)."""
        minimal = self.base_minimal()
        key = _key("base", self._base_keys[BASE_MINIMAL_IMAGE], *BASE_PACKAGES)

        def build() -> None:
            self.ensure_in_store(minimal)
            b = self.buildah
            container = b.run("from", "--pull-never", minimal.name).strip()
            try:
                script = (
                    "apt-get update -q && apt-get install -y -q --no-install-recommends "
                    f"{' '.join(BASE_PACKAGES)} && apt-get clean "
                    "&& rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin"
                )
                b.run("run", "--network", "host", container, "--", "sh", "-c", script,
                      timeout=1800, capture=False)  # fmt: skip
                b.commit(container, BASE_IMAGE)
            finally:
                b.run("rm", container)

        built = self._cached(BASE_IMAGE, key, build)
        self._base_keys[BASE_IMAGE] = key
        return built

    def project_image(
        self, image: str, dockerfile: Path, base: BuiltImage, args: dict[str, str]
    ) -> BuiltImage:
        """``image`` built from ``dockerfile`` on ``base`` with the pip settings."""
        build_args = {"BASE": base.name, **args}
        extra = [a for k, v in sorted(build_args.items()) for a in ("--build-arg", f"{k}={v}")]
        extra += self.pip.buildah_args()
        context = dockerfile.parent
        key = _key(
            image,
            self._base_keys[base.name],
            hashlib.sha256(dockerfile.read_bytes()).hexdigest(),
            context_digest(context, copy_sources(dockerfile)),
            *extra,
        )

        def build() -> None:
            self.ensure_in_store(base)
            self.buildah.bud(context, dockerfile, image, extra)
            self.buildah.prune_untagged()

        return self._cached(image, key, build)


@contextmanager
def build_lock(cache_dir: Path, timeout: float = BUILD_TIMEOUT) -> Iterator[None]:
    """Hold the cache's image build lock: one build at a time (several checkouts, tests and
    clusters may share a cache); a second caller waits, then finds the images cached."""
    with waiting_lock(cache_dir / "images" / ".lock", timeout, "an image build", ImageBuildError):
        yield


def ensure_images(cache_dir: Path, *, rebuild: bool = False) -> list[BuiltImage]:
    """Pause, base, operator and worker images, built when their inputs changed.

    ``rebuild`` builds them again even when cached (build layers are still reused).
    """
    with build_lock(cache_dir):
        return _ensure_images(cache_dir, rebuild=rebuild)


def _ensure_images(cache_dir: Path, *, rebuild: bool) -> list[BuiltImage]:
    builder = ImageBuilder(cache_dir, rebuild=rebuild)
    started = time.monotonic()
    pause = builder.pause()
    base = builder.base()
    operator = builder.project_image(operator_image(), REPO_ROOT / "Dockerfile.operator", base, {})
    # An empty TORCH_INDEX: torch comes from the index pip is configured with here.
    worker = builder.project_image(
        worker_image(), REPO_ROOT / "Dockerfile.worker", base, {"TORCH_INDEX": ""}
    )
    images = [pause, base, operator, worker]
    logger.info("images ready in %.1f s", time.monotonic() - started)
    return images
