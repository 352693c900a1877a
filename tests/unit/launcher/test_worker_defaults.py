"""The worker defaults (``elasticjob.library_env``) in the processes ``elasticjob-run``
starts: torch's huge pages unless the launcher's environment says otherwise. Real processes:
the worker allocates a torch tensor and reads its own memory map."""

from __future__ import annotations

import asyncio
import io
import json
import sys
from pathlib import Path

import pytest

from elasticjob.launcher.processes import LocalWorkerLauncher, WorkerEnvironment
from elasticjob.library_env import ENV_TORCH_HUGE_PAGES, WORKER_DEFAULTS, with_worker_defaults
from elasticjob.rendezvous.job_credentials import JobKey
from elasticjob.wire.messages import WorkerId
from elasticjob.worker_contract import WorkerSettings
from tests.support.rendezvous_jobs import slot_of

WORKER = WorkerId("127.0.0.1", 0)
DEADLINE_S = 60.0
"""Bound on the worker's run (its import of torch included)."""
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")

# Says its variable and how much of its anonymous memory is on huge pages, once a 64 MB
# tensor is written.
REPORT = """
import json, os, torch
t = torch.ones(16 * 2**20)
rollup = open("/proc/self/smaps_rollup").read().splitlines()
(huge,) = (int(line.split()[1]) for line in rollup if line.startswith("AnonHugePages:"))
print(json.dumps({"variable": os.environ.get("THP_MEM_ALLOC_ENABLE"), "huge_kb": huge}))
"""


def kernel_thp() -> str | None:
    """The kernel's transparent huge page mode (``always``, ``madvise``, ``never``), or None
    where it has none."""
    try:
        text = THP_SETTING.read_text()
    except OSError:
        return None
    return text[text.index("[") + 1 : text.index("]")]


async def run_worker(base_env: dict[str, str]) -> dict[str, object]:
    exits: asyncio.Queue[int] = asyncio.Queue()
    output = io.StringIO()
    launcher = LocalWorkerLauncher(
        [sys.executable, "-c", REPORT],
        WorkerEnvironment(
            WorkerSettings(rendezvous_url="http://127.0.0.1:1", job="job"), JobKey("the-key")
        ),
        lambda _worker, code: exits.put_nowait(code),
        lambda _worker: 0,
        warm=False,
        base_env=base_env,
        output=output,
    )
    await launcher.start(WORKER, slot_of(WORKER))
    try:
        assert await asyncio.wait_for(exits.get(), DEADLINE_S) == 0, output.getvalue()
    finally:
        await asyncio.wait_for(launcher.stop_all(), DEADLINE_S)
    line = next(line for line in output.getvalue().splitlines() if "huge_kb" in line)
    report: dict[str, object] = json.loads(line.split(":", 1)[1])
    return report


def test_a_variable_the_environment_names_is_left_as_it_is() -> None:
    assert with_worker_defaults({}) == {d.variable: d.value for d in WORKER_DEFAULTS}
    assert with_worker_defaults({ENV_TORCH_HUGE_PAGES: "0", "X": "1"}) == {
        ENV_TORCH_HUGE_PAGES: "0",
        "X": "1",
    }


@pytest.mark.skipif(sys.platform != "linux", reason="the launcher's workers are Linux processes")
@pytest.mark.skipif(
    kernel_thp() not in ("madvise", "always"), reason="the kernel has no transparent huge pages"
)
async def test_a_worker_puts_its_large_tensors_on_huge_pages() -> None:
    """torch's allocator madvises its tensors of 2 MB and more: a 64 MB tensor takes at least
    one huge page."""
    report = await run_worker({"PATH": "/usr/bin:/bin"})
    assert report["variable"] == "1"
    assert isinstance(report["huge_kb"], int) and report["huge_kb"] >= 2048, report


@pytest.mark.skipif(sys.platform != "linux", reason="the launcher's workers are Linux processes")
@pytest.mark.skipif(kernel_thp() != "madvise", reason="only where the kernel waits to be asked")
async def test_a_launcher_environment_with_the_variable_off_keeps_huge_pages_off() -> None:
    report = await run_worker({"PATH": "/usr/bin:/bin", ENV_TORCH_HUGE_PAGES: "0"})
    assert report == {"variable": "0", "huge_kb": 0}
