"""The lint step's check of the product's modules (scripts/check_modules.py): it names every
module over the limit and every file name held twice, and passes a tree without either."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "check_modules", REPO / "scripts/check_modules.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(path: Path, lines: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x = 1\n" * lines)
    return path


def test_a_long_module_and_a_file_name_held_twice_are_named(tmp_path: Path) -> None:
    check = checker()
    package = tmp_path / "elasticjob"
    modules = [
        write(package / "__init__.py", 0),
        write(package / "a" / "__init__.py", 0),
        write(package / "b" / "__init__.py", 0),
        write(package / "a" / "rounds.py", 10),
        write(package / "b" / "rounds.py", 10),
        write(package / "a" / "big.py", check.MAX_LINES + 1),
        write(package / "b" / "fits.py", check.MAX_LINES),
    ]
    found = check.problems(modules, package)
    assert found == [
        f"elasticjob/a/big.py: {check.MAX_LINES + 1} lines (at most {check.MAX_LINES}; split it)",
        "rounds.py is the name of 2 modules: elasticjob/a/rounds.py, elasticjob/b/rounds.py",
    ]
    assert check.problems(modules[:3] + modules[-1:], package) == []


def test_the_product_modules_include_the_linked_folders() -> None:
    names = {p.relative_to(REPO / "elasticjob").parts[0] for p in checker().product_modules()}
    assert {"operator", "worker_runtime", "driver", "rendezvous"} <= names
