"""The test suites' layout: the devcluster fixtures are loaded only by the suites that need a
cluster, so unit and integration runs never import devcluster; what test modules share lives
in tests/support/ (one fake clock among it), and no test module imports from another."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
SUPPORT = TESTS / "support"
WORKER_SCRIPTS = TESTS / "integration" / "workers"
"""Programs the integration tests run (and the modules beside them that they import)."""
USER_CODE = TESTS / "e2e" / "user_code"
"""A user's own training code (a script and a module beside it), which e2e tests submit."""
CLOCK = SUPPORT / "clock.py"
PROBE = """
import sys
import pytest
args = ["-q", "--collect-only", "-p", "no:cacheprovider", "tests/unit/driver/test_slots.py"]
code = pytest.main(args)
loaded = sorted(m for m in sys.modules if m == "devcluster" or m.startswith("devcluster."))
print("RESULT", int(code), loaded)
"""


def test_a_unit_run_does_not_import_devcluster() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert "RESULT 0 []" in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts)


def suite_modules() -> dict[str, Path]:
    """Every module of the test suites by its dotted name."""
    return {module_name(p): p for p in sorted(TESTS.rglob("*.py"))}


def imported(path: Path) -> set[str]:
    """The modules ``path`` imports (anywhere in it), by their dotted names."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: a relative import"
            found.add(node.module or "")
    return found


def is_test_module(path: Path) -> bool:
    return path.name.startswith("test_")


def test_shared_code_lives_in_tests_support() -> None:
    misplaced = [
        str(path.relative_to(REPO))
        for path in suite_modules().values()
        if not is_test_module(path)
        and path.name not in ("conftest.py", "__init__.py")
        and SUPPORT not in path.parents
        and WORKER_SCRIPTS not in path.parents
        and USER_CODE not in path.parents
    ]
    assert not misplaced, f"shared code outside tests/support/: {misplaced}"


def test_test_modules_import_shared_code_from_tests_support_only() -> None:
    """Never from another test module (nor from a conftest, or shared code elsewhere)."""
    wrong = sorted(
        f"{path.relative_to(REPO)} imports {name}"
        for path in suite_modules().values()
        for name in imported(path)
        if name.startswith("tests.")
        and not name.startswith(("tests.support.", "tests.integration.workers."))
    )
    assert not wrong, "import shared code from tests.support:\n" + "\n".join(wrong)


def test_unit_tests_need_no_cluster_prerequisites() -> None:
    """No unit test module imports devcluster, directly or through what it imports from the
    tests (its cluster, helm and binaries are the cluster suites' prerequisites)."""
    files = suite_modules()

    def reaches_devcluster(name: str, seen: set[str]) -> bool:
        if name in seen or name not in files:
            return False
        seen.add(name)
        names = imported(files[name])
        if any(n == "devcluster" or n.startswith("devcluster.") for n in names):
            return True
        return any(reaches_devcluster(n, seen) for n in names)

    unit = [name for name, path in files.items() if (TESTS / "unit") in path.parents]
    assert unit
    assert not [name for name in unit if reaches_devcluster(name, set())]


def is_fake_clock(node: ast.ClassDef) -> bool:
    """A class named a clock, or one whose instances are called for ``self.now``."""
    if node.name.endswith("Clock"):
        return True
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name == "__call__":
            for ret in ast.walk(item):
                value = ret.value if isinstance(ret, ast.Return) else None
                if isinstance(value, ast.Attribute) and value.attr == "now":
                    return True
    return False


def test_the_fake_clock_is_defined_once() -> None:
    clocks = sorted(
        f"{path.relative_to(REPO)}: {node.name}"
        for path in suite_modules().values()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef) and is_fake_clock(node)
    )
    assert clocks == [f"{CLOCK.relative_to(REPO)}: {n}" for n in ("FakeClock", "LateLoopClock")]
