"""The machine's pip configuration, handed to image builds.

Images are built where pip may be configured to use a local mirror, extra indexes, wheel
directories or a private CA. :func:`pip_settings` reads that configuration at run time (``pip
config list``, which includes the ``PIP_*`` environment) and turns it into build arguments
(``PIP_INDEX_URL``, ``PIP_FIND_LINKS``...; the Dockerfiles declare them as ``ARG`` so that
their ``RUN pip install`` steps see them) and read-only build-time mounts for every local
directory or file they name, under :data:`MOUNT_ROOT` inside the build, the settings rewritten
to match. Nothing about the machine ends up in the project or in the images' configuration.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

logger = logging.getLogger(__name__)

#: Where the build sees the local paths pip's settings name (not at their own paths: a
#: build may write there, as installing ca-certificates writes the machine's CA bundle path).
MOUNT_ROOT = "/run/pip-build"
#: pip options passed on to builds: option name -> whether it holds several values.
OPTIONS = {
    "index-url": False,
    "extra-index-url": True,
    "find-links": True,
    "trusted-host": True,
    "cert": False,
    "default-timeout": False,
}
#: Options whose values may name local files or directories (mounted into the build).
LOCATION_OPTIONS = frozenset({"index-url", "extra-index-url", "find-links", "cert"})
#: Options naming package indexes: a local index's pages link to files beside the index
#: (``<root>/simple/<project>/`` -> ``../../files/...``), so its parent is mounted.
INDEX_OPTIONS = frozenset({"index-url", "extra-index-url"})
#: Later scopes override earlier ones, as in pip.
SCOPES = ("global", "user", "site", ":env:")
#: Seconds ``pip config list`` may take.
PIP_TIMEOUT = 60.0


@dataclass(frozen=True)
class PipSettings:
    """What a build needs to install packages the way pip is configured here."""

    #: ``PIP_*`` build arguments, their local locations rewritten to the mounts' targets.
    build_args: dict[str, str]
    #: (local path, path inside the build) of every read-only build-time mount.
    mounts: tuple[tuple[Path, str], ...]

    def buildah_args(self) -> list[str]:
        """``--build-arg`` and ``-v`` arguments for ``buildah bud``."""
        args: list[str] = []
        for key, value in sorted(self.build_args.items()):
            args += ["--build-arg", f"{key}={value}"]
        for source, target in self.mounts:
            args += ["-v", f"{source.resolve()}:{target}:ro"]
        return args


def parse_config_list(text: str) -> dict[str, str]:
    """The effective values of :data:`OPTIONS` in ``pip config list`` output.

    Lines look like ``global.find-links='/some/dir'`` or ``:env:.cert='...'``; for each option
    the value of the highest-priority scope wins (environment over site over user over global).
    """
    found: dict[str, tuple[int, str]] = {}
    for line in text.splitlines():
        name, sep, raw = line.partition("=")
        if not sep:
            continue
        scope, _, option = name.rpartition(".")
        if option not in OPTIONS or scope not in SCOPES:
            continue
        value = raw.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        rank = SCOPES.index(scope)
        if option not in found or found[option][0] <= rank:
            found[option] = (rank, value)
    return {option: value for option, (_, value) in found.items()}


def local_path(location: str) -> Path | None:
    """The local path a pip location names (a ``file://`` URL or a path), if any."""
    if location.startswith("file:"):
        return Path(unquote(urlparse(location).path))
    if location.startswith("/"):
        return Path(location)
    return None


def settings_from_options(options: dict[str, str]) -> PipSettings:
    """Build arguments and mounts for the given pip options."""
    lists = {o: v.split() if OPTIONS[o] else [v] for o, v in options.items() if v.split()}
    wanted: set[Path] = set()
    for option, values in lists.items():
        for location in values if option in LOCATION_OPTIONS else []:
            path = local_path(location)
            if path is None:
                continue
            if not path.exists():
                logger.warning("pip's %s names %s, which does not exist; not mounted", option, path)
                continue
            wanted.add(path.parent if option in INDEX_OPTIONS else path)
    # A directory inside another mounted one needs no mount of its own.
    outer = sorted(m for m in wanted if not any(o in m.parents for o in wanted))
    mounts = {source: f"{MOUNT_ROOT}/{i}" for i, source in enumerate(outer)}

    def inside(location: str) -> str:
        path = local_path(location)
        source = next(
            (m for m in outer if path is not None and (m == path or m in path.parents)), None
        )
        if path is None or source is None:
            return location
        target = f"{mounts[source]}{str(path)[len(str(source)) :]}"
        return f"file://{target}" if location.startswith("file:") else target

    build_args = {
        "PIP_" + option.upper().replace("-", "_"): " ".join(map(inside, values))
        for option, values in lists.items()
    }
    return PipSettings(build_args=build_args, mounts=tuple(mounts.items()))


def pip_settings(python: str = sys.executable) -> PipSettings:
    """The pip configuration of ``python`` (this interpreter by default), for builds."""
    result = subprocess.run(
        [python, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=PIP_TIMEOUT,
        check=True,
    )
    settings = settings_from_options(parse_config_list(result.stdout))
    logger.debug("pip settings for builds: %s", settings)
    return settings
