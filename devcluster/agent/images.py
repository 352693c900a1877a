"""Image name -> how a container's process is run. Nothing is ever pulled.

Rules, first match wins (the registry host, ``library/`` and the tag or digest
are ignored when matching):

============================  =========  ==================================================
image                          kind       process
============================  =========  ==================================================
extra rules (``--image-map``)  any        as the rule's kind says
``elasticjob/*``               project    the project's virtualenv first on PATH
                                          (``python`` is the venv's), VIRTUAL_ENV set,
                                          default workingDir the repository root
``python``                     python     the base interpreter of that virtualenv as
                                          ``python``/``python3``, no project packages;
                                          default command ``python3``
``busybox``, ``alpine``,       host       the machine's own userland (/bin/sh, coreutils);
``debian``, ``ubuntu``                    default command ``sh``
anything else                  --         pod stays Pending, container waiting with
                                          reason ErrImagePull then ImagePullBackOff
============================  =========  ==================================================

Every kind sets ``PYTHONUNBUFFERED=1`` (unless the pod sets it) so logs appear live.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from devcluster.config import REPO_ROOT, project_venv

logger = logging.getLogger(__name__)

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
KINDS = ("project", "python", "host")
BUILTIN_RULES = (
    ("elasticjob/*", "project"),
    ("python", "python"),
    ("busybox", "host"),
    ("alpine", "host"),
    ("debian", "host"),
    ("ubuntu", "host"),
)


class UnknownImage(Exception):
    """No rule maps this image to a local runtime."""


@dataclass(frozen=True)
class ImageRuntime:
    """How to run a container of a given image."""

    image: str
    kind: str
    env: dict[str, str] = field(default_factory=dict)
    default_command: tuple[str, ...] = ()
    default_workdir: str | None = None

    @property
    def image_id(self) -> str:
        """What containerStatuses[].imageID reports."""
        return f"devcluster://{self.kind}/{repository(self.image)}"


def repository(image: str) -> str:
    """``docker.io/library/python:3.11@sha256:..`` -> ``python``."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)
    if ":" in last[-1]:
        name = name[: name.rfind(":")]
    parts = name.split("/")
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        parts = parts[1:]
    if len(parts) > 1 and parts[0] == "library":
        parts = parts[1:]
    return "/".join(parts)


def _python_shim_dir(run_dir: Path) -> Path:
    """A bin/ with ``python``/``python3`` pointing at the base interpreter."""
    shim = run_dir / "images" / "python" / "bin"
    if not shim.exists():
        shim.mkdir(parents=True, exist_ok=True)
        base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
        if not base.exists():
            base = Path(sys.base_prefix) / "bin" / "python3"
        for name in ("python", "python3"):
            link = shim / name
            if not link.exists():
                link.symlink_to(base)
    return shim


class ImageResolver:
    """Applies the mapping rules."""

    def __init__(self, run_dir: Path, extra_rules: list[str]) -> None:
        self._run_dir = run_dir
        self._rules: list[tuple[str, str]] = []
        for rule in [*extra_rules, *os.environ.get("DEVCLUSTER_IMAGE_MAP", "").split(",")]:
            if not rule.strip():
                continue
            pattern, _, kind = rule.partition("=")
            if kind.strip() not in KINDS:
                raise ValueError(f"image rule {rule!r}: kind must be one of {KINDS}")
            self._rules.append((pattern.strip(), kind.strip()))
        self._rules.extend(BUILTIN_RULES)

    def resolve(self, image: str) -> ImageRuntime:
        """The runtime of ``image``; raises UnknownImage."""
        repo = repository(image)
        for pattern, kind in self._rules:
            if fnmatch.fnmatchcase(repo, pattern):
                return self._runtime(image, kind)
        raise UnknownImage(
            f'image "{image}" is not available: devcluster pulls no images and has no '
            f"rule for {repo!r} (known: elasticjob/*, python, busybox, alpine, debian, "
            "ubuntu; add one with --image-map PATTERN=project|python|host)"
        )

    def _runtime(self, image: str, kind: str) -> ImageRuntime:
        base = {"PYTHONUNBUFFERED": "1", "LANG": "C.UTF-8", "HOME": "/root"}
        if kind == "project":
            venv = project_venv()
            path = SYSTEM_PATH if venv is None else f"{venv / 'bin'}:{SYSTEM_PATH}"
            env = {**base, "PATH": path}
            if venv is not None:
                env["VIRTUAL_ENV"] = str(venv)
            return ImageRuntime(image, kind, env, (), str(REPO_ROOT))
        if kind == "python":
            shim = _python_shim_dir(self._run_dir)
            env = {**base, "PATH": f"{shim}:{SYSTEM_PATH}"}
            return ImageRuntime(image, kind, env, ("python3",), None)
        return ImageRuntime(image, kind, {**base, "PATH": SYSTEM_PATH}, ("sh",), None)
