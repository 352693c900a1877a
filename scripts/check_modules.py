"""The lint step's check of the product's modules (the ``elasticjob`` package, ``operator/``
and ``worker_runtime/`` included): none is longer than :data:`MAX_LINES` lines, and no two
share a file name. Prints each offender and exits 1 if there is one."""

from __future__ import annotations

import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Final

MAX_LINES: Final = 400
"""Past this a module holds more than one responsibility: split it by responsibility."""
PACKAGE: Final = Path(__file__).resolve().parents[1] / "elasticjob"


def product_modules(package: Path = PACKAGE) -> list[Path]:
    """Every module of the package, following its linked folders."""
    return sorted(
        Path(folder) / name
        for folder, _, names in os.walk(package, followlinks=True)
        for name in names
        if name.endswith(".py")
    )


def problems(modules: list[Path], package: Path = PACKAGE) -> list[str]:
    """What is wrong with ``modules``: each one too long, each file name held twice."""
    found = []
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in modules:
        where = path.relative_to(package.parent).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            found.append(f"{where}: {lines} lines (at most {MAX_LINES}; split it)")
        if path.name != "__init__.py":
            by_name[path.name].append(where)
    for name, places in sorted(by_name.items()):
        if len(places) > 1:
            found.append(f"{name} is the name of {len(places)} modules: {', '.join(places)}")
    return found


def main() -> int:
    found = problems(product_modules())
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
