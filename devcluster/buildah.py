"""A daemonless image builder: buildah with devcluster's own storage, and a Debian base.

:class:`Buildah` runs ``buildah`` with its own storage root and run root (under devcluster's
cache directory, never the machine's default storage) and its own signature policy, so that
builds neither see nor change images of other tools. :func:`debootstrap_rootfs` makes a Debian
root filesystem from Debian's packages, on the mirror the machine's apt sources use.
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

#: Seconds one buildah command may take (a cold worker build installs torch).
BUILD_TIMEOUT = 3600.0
#: Seconds one quick buildah command (inspect, config, tag...) may take.
QUICK_TIMEOUT = 300.0
#: Seconds debootstrap may take.
DEBOOTSTRAP_TIMEOUT = 1800.0
SUITE = "bookworm"
APT_SOURCES = Path("/etc/apt")
POLICY = {"default": [{"type": "insecureAcceptAnything"}]}


class ImageBuildError(RuntimeError):
    """An image could not be built or exported."""


def _run(argv: Sequence[str], timeout: float, *, capture: bool = False) -> str:
    logger.debug("running %s", " ".join(argv))
    try:
        result = subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if capture else None,
            stderr=subprocess.PIPE if capture else None,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as err:
        raise ImageBuildError(f"{argv[0]} {argv[1] if len(argv) > 1 else ''} timed out") from err
    if result.returncode != 0:
        detail = (result.stderr or "").strip()[-2000:] if capture else "(see its output above)"
        raise ImageBuildError(f"{' '.join(argv[:3])}... failed ({result.returncode}): {detail}")
    return result.stdout or ""


class Buildah:
    """``buildah`` on a private image store under ``store``."""

    def __init__(self, store: Path) -> None:
        self.store = store
        self.policy = store / "policy.json"
        binary = shutil.which("buildah")
        if binary is None:
            raise ImageBuildError("buildah is not installed (Debian package buildah)")
        self.binary = binary

    def _prepare(self) -> None:
        self.store.mkdir(parents=True, exist_ok=True)
        if not self.policy.exists():
            self.policy.write_text(json.dumps(POLICY))

    def run(self, *args: str, timeout: float = QUICK_TIMEOUT, capture: bool = True) -> str:
        """``buildah ARGS`` on this store; its output when ``capture``."""
        self._prepare()
        argv = [
            self.binary,
            "--root",
            str(self.store / "storage"),
            "--runroot",
            str(self.store / "run"),
            "--storage-driver",
            "overlay",
            *args,
        ]
        return _run(argv, timeout, capture=capture)

    def image_id(self, image: str) -> str | None:
        """The ID of the image named ``image`` in the store (None: there is none)."""
        try:
            out = self.run("inspect", "--type", "image", "--format", "{{.FromImageID}}", image)
        except ImageBuildError:
            return None
        return out.strip()

    def inspect(self, image: str) -> dict[str, object]:
        """The image's OCI configuration (``config``: User, Entrypoint, Cmd...)."""
        out = self.run("inspect", "--type", "image", image)
        data: dict[str, object] = json.loads(out)["OCIv1"]
        return data

    def from_rootfs(self, image: str, rootfs_tar: Path, config: Sequence[str]) -> None:
        """Commit ``image`` holding the files of ``rootfs_tar``, configured by ``config``
        (``buildah config`` arguments)."""
        container = self.run("from", "--signature-policy", str(self.policy), "scratch").strip()
        try:
            self.run("add", container, str(rootfs_tar), "/")
            if config:
                self.run("config", *config, container)
            self.commit(container, image)
        finally:
            self.run("rm", container)

    def commit(self, container: str, image: str) -> None:
        """Commit a working container as ``image`` (layers stored uncompressed)."""
        self.run(
            "commit", "--signature-policy", str(self.policy), "--rm=false", container, image,
            timeout=BUILD_TIMEOUT,
        )  # fmt: skip

    def bud(self, context: Path, dockerfile: Path, image: str, extra: Sequence[str]) -> None:
        """``buildah bud`` with cached layers, host networking and no pulls."""
        self.run(
            "bud",
            "--signature-policy", str(self.policy),
            "--layers",
            "--force-rm",
            "--pull-never",
            "--network", "host",
            "--format", "oci",
            "-f", str(dockerfile),
            "-t", image,
            *extra,
            str(context),
            timeout=BUILD_TIMEOUT,
            capture=False,
        )  # fmt: skip

    def push(self, image: str, destination: str, timeout: float = BUILD_TIMEOUT) -> None:
        """Copy ``image`` to ``destination`` (a containers-image transport: ``oci:DIR:NAME``,
        ``docker-archive:TAR:NAME``...)."""
        self.run(
            "push", "--signature-policy", str(self.policy), image, destination, timeout=timeout
        )

    def export(self, image: str, archive: Path) -> None:
        """Write ``image`` to a docker-archive tar that ``ctr images import`` names ``image``."""
        tmp = archive.with_name(archive.name + ".tmp")
        tmp.unlink(missing_ok=True)
        self.push(image, f"docker-archive:{tmp}:{image}")
        tmp.rename(archive)

    def load(self, archive: Path, image: str) -> None:
        """Put an exported image back into the store (when the store was cleared)."""
        self.run(
            "pull", "--signature-policy", str(self.policy), f"docker-archive:{archive}",
            timeout=BUILD_TIMEOUT,
        )  # fmt: skip
        if self.image_id(image) is None:
            raise ImageBuildError(f"{archive} does not hold {image}")

    def prune_untagged(self) -> None:
        """Drop dangling images (superseded builds); cached layers of current builds stay.
        Housekeeping only: an image still in use (by a container of a concurrent run) stays."""
        try:
            self.run("rmi", "--prune", timeout=BUILD_TIMEOUT)
        except ImageBuildError as err:
            logger.warning("could not prune superseded images: %s", err)


def _deb822_mirror(text: str) -> str | None:
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            key, sep, value = line.partition(":")
            if sep and not line.startswith((" ", "#")):
                fields[key.strip().lower()] = value.strip()
        uris = fields.get("uris", "").split()
        if (
            uris
            and "deb" in fields.get("types", "deb").split()
            and SUITE in fields.get("suites", "").split()
        ):
            return uris[0]
    return None


def _one_line_mirror(text: str) -> str | None:
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if not words or words[0] != "deb":
            continue
        words = [w for w in words[1:] if not w.startswith("[")]
        if len(words) >= 2 and "://" in words[0] and words[1] == SUITE:
            return words[0]
    return None


def debian_mirror(apt_dir: Path = APT_SOURCES) -> str | None:
    """The mirror the machine's apt sources use for the suite (None: debootstrap's default)."""
    for path in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        if found := _deb822_mirror(path.read_text()):
            return found
    for path in [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]:
        if path.exists() and (found := _one_line_mirror(path.read_text())):
            return found
    return None


def debootstrap_rootfs(work: Path, tarball: Path) -> None:
    """``debootstrap --variant=minbase`` of the suite into ``work``, packed into ``tarball``."""
    debootstrap = shutil.which("debootstrap") or (
        "/usr/sbin/debootstrap" if Path("/usr/sbin/debootstrap").exists() else None
    )
    if debootstrap is None:
        raise ImageBuildError("debootstrap is not installed (Debian package debootstrap)")
    mirror = debian_mirror()
    rootfs = work / "rootfs"
    if rootfs.exists():
        shutil.rmtree(rootfs)
    started = time.monotonic()
    logger.info("debootstrap --variant=minbase %s from %s", SUITE, mirror or "its default mirror")
    _run(
        [debootstrap, "--variant=minbase", SUITE, str(rootfs), *([mirror] if mirror else [])],
        DEBOOTSTRAP_TIMEOUT,
        capture=True,
    )
    # No package lists, caches or downloaded .debs in the image: apt-get update makes them.
    for leftover in ("var/cache/apt", "var/cache/apt/archives", "var/lib/apt/lists"):
        for entry in (rootfs / leftover).glob("*"):
            if entry.is_file():
                entry.unlink()
    tmp = tarball.with_name(tarball.name + ".tmp")
    _run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(tmp), "."], DEBOOTSTRAP_TIMEOUT)
    tmp.rename(tarball)
    shutil.rmtree(rootfs)
    logger.info("debootstrap took %.0f s", time.monotonic() - started)
