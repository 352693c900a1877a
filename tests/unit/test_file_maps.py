"""The file maps of the code folders' READMEs (tables "for a change to | open"): each module
of the folder is in exactly one row, and every row names modules that exist."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("elasticjob/driver", "elasticjob/rendezvous", "operator", "worker_runtime")
SEPARATOR = re.compile(r"^\|[\s:|-]+\|$")
MODULE = re.compile(r"`([^`\s]+\.py)`")


def modules(folder: Path) -> set[str]:
    """The folder's modules, subfolders included, by their paths from it; an ``__init__.py``
    that holds only a docstring is no module to map."""
    found = set()
    for path in folder.rglob("*.py"):
        body = ast.parse(path.read_text()).body
        if path.name == "__init__.py" and all(isinstance(node, ast.Expr) for node in body):
            continue
        found.add(path.relative_to(folder).as_posix())
    return found


def map_rows(readme: Path) -> list[list[str]]:
    """The modules each row of the README's tables names in its last column (the header
    rows left out)."""
    lines = [line.strip() for line in readme.read_text().splitlines()]
    return [
        MODULE.findall(line.strip("|").split("|")[-1])
        for i, line in enumerate(lines)
        if line.startswith("|")
        and not SEPARATOR.match(line)
        and not (i + 1 < len(lines) and SEPARATOR.match(lines[i + 1]))
    ]


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_module_is_in_one_row_and_every_row_names_existing_modules(folder: str) -> None:
    root = REPO / folder
    rows = map_rows(root / "README.md")
    assert rows, f"{folder}/README.md has no file map"
    assert all(rows), f"{folder}/README.md: a row of its map names no module"
    missing = sorted(name for row in rows for name in row if not (root / name).is_file())
    assert not missing, f"{folder}/README.md names modules that do not exist: {missing}"
    named = [{(root / name).resolve() for name in row} for row in rows]
    inside = root.resolve()
    rows_of = Counter(
        path.relative_to(inside).as_posix()
        for row in named
        for path in row
        if inside in path.parents
    )
    assert sorted(modules(root) - set(rows_of)) == [], f"missing from {folder}/README.md"
    assert sorted(m for m, n in rows_of.items() if n > 1) == [], f"in several rows of {folder}"
