"""Run Horovod's own tests of its PyTorch API against elasticjob: the measure of issue 25's
promise that a Horovod script needs one changed line.

Takes a Horovod source tree (``--horovod-src``, e.g. a checkout of v0.28.1), copies its
``test/parallel/test_torch.py`` with ``import horovod.torch as hvd`` changed to
``import elasticjob.worker_runtime as hvd``, beside a small ``common.py`` of the three helpers
the file imports, and runs each test in a fresh 2-process job on one loopback host
(``elasticjob-run -np 2``), as Horovod's CI runs them under ``horovodrun -np 2``. Prints each
test's outcome and the share that passed; ``--out`` keeps each job's output.

Usage: python scripts/horovod_api_tests.py --horovod-src DIR [-k SUBSTRING] [--out DIR]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

IMPORT = "import horovod.torch as hvd"
OURS = "import elasticjob.worker_runtime as hvd"
HELPERS = '''"""The helpers Horovod's test_torch.py imports from its test/utils/common.py."""
import contextlib, os, tempfile


def mpi_env_rank_and_size():
    return int(os.environ["HOROVOD_RANK"]), int(os.environ["HOROVOD_SIZE"])


def skip_or_fail_gpu_test(test, message):
    test.skipTest(message)


@contextlib.contextmanager
def temppath():
    handle, path = tempfile.mkstemp()
    os.close(handle)
    try:
        yield path
    finally:
        if os.path.exists(path):
            os.remove(path)
'''
TIMEOUT_S = 300
SUMMARY = re.compile(r"<stdout>:=*\s*(\d+ (?:passed|failed|skipped|error)[^\n]*) in [\d.]+s")
"""Each rank's pytest summary line (through the launcher's prefixed output)."""


def tests_of(folder: Path) -> list[str]:
    listed = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "test_torch.py"],
        cwd=folder, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return [line for line in listed.stdout.splitlines() if "::" in line]


def outcome(folder: Path, test: str, out: Path | None) -> str:
    command = [
        sys.executable, "-m", "elasticjob.launcher.run_command", "-np", "2", "-H", "127.0.1.1:2",
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", test,
    ]  # fmt: skip
    try:
        job = subprocess.run(
            command, check=False, cwd=folder, capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return "timeout"
    text = job.stdout + job.stderr
    if out is not None:
        (out / f"{test.rsplit('::', maxsplit=1)[-1]}.log").write_text(text)
    # Each rank's pytest says how its test ended. A test that skips, or passes without
    # hvd.init(), never joins the job, which the launcher then fails (a worker command that
    # never joins is taken for a broken one): pytest's outcome is the test's.
    ends = [m.group(1) for m in SUMMARY.finditer(job.stdout)]
    if any(" failed" in line or " error" in line for line in ends) or not ends:
        return "failed"
    if all(" skipped" in line and " passed" not in line for line in ends):
        return "skipped"
    return "passed" if all(" passed" in line for line in ends) else "failed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--horovod-src", type=Path, required=True)
    parser.add_argument("-k", default="", help="only tests whose name contains this")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    source = (args.horovod_src / "test" / "parallel" / "test_torch.py").read_text()
    if IMPORT not in source:
        raise SystemExit(f"{IMPORT!r} is not in test_torch.py")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        (folder / "test_torch.py").write_text(source.replace(IMPORT, OURS))
        (folder / "common.py").write_text(HELPERS)
        counts: dict[str, list[str]] = {}
        for test in tests_of(folder):
            if args.k in test:
                result = outcome(folder, test, args.out)
                counts.setdefault(result, []).append(test.split("::")[-1])
                print(f"{result:8} {test.split('::')[-1]}", flush=True)
    ran = sum(len(v) for k, v in counts.items() if k != "skipped")
    passed = len(counts.get("passed", []))
    print(
        f"\n{passed} of {ran} tests that ran passed ({100 * passed / max(ran, 1):.0f} %); "
        + ", ".join(f"{len(v)} {k}" for k, v in sorted(counts.items()))
    )


if __name__ == "__main__":
    main()
