"""A training script, or a small folder of code, packed for a ConfigMap.

``elasticjob submit`` carries a user's code into the worker pods through a ConfigMap mounted as
a volume: no image to build for a script that runs in the worker image. A ConfigMap holds at
most 1 MiB, so a bundle is capped (:data:`MAX_BUNDLE_BYTES`) and refused beyond it with the
largest files named: data and weights belong on a volume or in an image of one's own
(``docs/your-first-job.md``).
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

MAX_BUNDLE_BYTES: Final = 800 * 1024
"""The most a bundle may hold, as stored (binary files count base64-encoded): under the 1 MiB
of a ConfigMap, with room for its metadata."""

SKIPPED_DIRS: Final = frozenset({"__pycache__", "node_modules", "venv", "site-packages"})
"""Folders never packed (besides hidden ones, whose names start with a dot)."""

SKIPPED_SUFFIXES: Final = frozenset({".pyc", ".pyo"})

DEFAULT_ENTRY: Final = "train.py"
"""The script run from a folder when none is named."""

_KEY_CHARS = re.compile(r"[^-._a-zA-Z0-9]")


class BundleError(ValueError):
    """The code cannot be packed: the message says why and what to do."""


@dataclass(frozen=True)
class BundleFile:
    """One file of a bundle: its path in the code folder (``/``-separated), its ConfigMap key
    and its content."""

    path: str
    key: str
    content: bytes

    @property
    def text(self) -> str | None:
        """The content as text (None: it is binary, stored base64-encoded)."""
        try:
            return self.content.decode()
        except UnicodeDecodeError:
            return None

    @property
    def stored_bytes(self) -> int:
        """What the file takes in the ConfigMap."""
        return len(self.content) if self.text is not None else 4 * -(-len(self.content) // 3)


@dataclass(frozen=True)
class CodeBundle:
    """The files to carry and the script to run (``entry``, a path among them)."""

    files: tuple[BundleFile, ...]
    entry: str

    @property
    def stored_bytes(self) -> int:
        return sum(f.stored_bytes for f in self.files)

    def config_map_data(self) -> tuple[dict[str, str], dict[str, str]]:
        """The ConfigMap's ``data`` (text files) and ``binaryData`` (the others, base64)."""
        data, binary = {}, {}
        for f in self.files:
            text = f.text
            if text is None:
                binary[f.key] = base64.b64encode(f.content).decode()
            else:
                data[f.key] = text
        return data, binary

    def volume_items(self) -> list[dict[str, str]]:
        """The volume's ``items``: each key at its path, so the folder's layout is kept."""
        return [{"key": f.key, "path": f.path} for f in self.files]


def bundle_code(
    path: Path, entry: str | None = None, max_bytes: int = MAX_BUNDLE_BYTES
) -> CodeBundle:
    """Pack ``path``: a script (``entry`` must then be None), or a folder whose script is
    ``entry`` (a path inside it; default :data:`DEFAULT_ENTRY`). Hidden files and folders,
    caches and compiled files are left out. Raises :class:`BundleError`."""
    if path.is_file():
        if entry is not None:
            raise BundleError(f"--entry names a script inside a folder, and {path} is a file")
        files = [(path.name, path)]
        entry = path.name
    elif path.is_dir():
        files = sorted(_walk(path))
        entry = entry or DEFAULT_ENTRY
        if entry not in {name for name, _ in files}:
            raise BundleError(
                f"{path} has no {entry} to run: name the script with --entry (a path inside {path})"
            )
    else:
        raise BundleError(f"{path}: no such file or folder")
    bundle = CodeBundle(tuple(_files(files)), entry)
    if bundle.stored_bytes > max_bytes:
        largest = sorted(bundle.files, key=lambda f: f.stored_bytes, reverse=True)[:3]
        names = ", ".join(f"{f.path} ({_size(f.stored_bytes)})" for f in largest)
        raise BundleError(
            f"{path} holds {_size(bundle.stored_bytes)} of code, over the {_size(max_bytes)} "
            f"a ConfigMap can carry (largest: {names}); put data on a volume, or build an "
            "image with the code (docs/your-first-job.md)"
        )
    return bundle


def _walk(root: Path) -> list[tuple[str, Path]]:
    found = []
    for item in root.rglob("*"):
        relative = item.relative_to(root)
        parts = relative.parts
        if any(p.startswith(".") or p in SKIPPED_DIRS for p in parts):
            continue
        if item.is_file() and item.suffix not in SKIPPED_SUFFIXES:
            found.append((relative.as_posix(), item))
    return found


def _files(files: list[tuple[str, Path]]) -> list[BundleFile]:
    used: set[str] = set()
    packed = []
    for name, source in files:
        key = _KEY_CHARS.sub("_", name.replace("/", "."))[-240:].lstrip(".") or "file"
        while key in used:
            key = f"_{key}"
        used.add(key)
        packed.append(BundleFile(name, key, source.read_bytes()))
    return packed


def _size(n: int) -> str:
    return f"{n / 1024:.0f} KiB" if n < 1024 * 1024 else f"{n / 1024 / 1024:.1f} MiB"
